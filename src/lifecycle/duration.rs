//! Durations of `after` milestones: `90d`, `12h`, `1d12h`, `90m`, `30s`.

use jiff::{SignedDuration, Span};

/// Parses a milestone duration. Units are `d` (24 hours), `h`, `m` and `s`, largest first,
/// without spaces or fractions: the same grammar the CRD schema enforces with the pattern
/// `^([0-9]+[dhms])+$`. Parsing itself is jiff's "friendly" duration format.
pub fn parse_duration(text: &str) -> Result<SignedDuration, String> {
    let allowed = |c: char| c.is_ascii_digit() || matches!(c, 'd' | 'h' | 'm' | 's');
    if text.is_empty() || !text.starts_with(|c: char| c.is_ascii_digit()) || !text.chars().all(allowed) {
        return Err(format!(
            "invalid duration {text:?}: expected a number and unit, repeated, e.g. 90d, 12h, 1d12h, 90m (units d, h, m, s)"
        ));
    }
    let span: Span = text.parse().map_err(|e| {
        format!("invalid duration {text:?}: {e} (units d, h, m, s, largest first, e.g. 1d12h)")
    })?;
    if span.get_years() != 0
        || span.get_months() != 0
        || span.get_weeks() != 0
        || span.get_milliseconds() != 0
        || span.get_microseconds() != 0
        || span.get_nanoseconds() != 0
    {
        return Err(format!(
            "invalid duration {text:?}: only the units d, h, m and s are allowed"
        ));
    }
    let seconds = i64::from(span.get_days()) * 86_400
        + i64::from(span.get_hours()) * 3_600
        + span.get_minutes() * 60
        + span.get_seconds();
    Ok(SignedDuration::from_secs(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_unit_and_combinations() {
        let cases = [
            ("30s", 30),
            ("90m", 90 * 60),
            ("12h", 12 * 3600),
            ("90d", 90 * 86_400),
            ("1d12h", 86_400 + 12 * 3600),
            ("1d2h3m4s", 86_400 + 2 * 3600 + 3 * 60 + 4),
            ("0s", 0),
        ];
        for (text, seconds) in cases {
            assert_eq!(
                parse_duration(text),
                Ok(SignedDuration::from_secs(seconds)),
                "{text}"
            );
        }
    }

    #[test]
    fn rejects_other_units_and_shapes() {
        for text in [
            "", "d", "1", "1w", "1y", "2mo", "5ms", "1.5h", "-1d", "1 d", "PT1H", "1h1d", "h1",
        ] {
            let error = parse_duration(text).expect_err(text);
            assert!(error.contains("invalid duration"), "{text}: {error}");
        }
    }
}
