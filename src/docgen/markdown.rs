//! Markdown helpers shared by the generated pages.

/// Text made fit for one table cell: lines joined, pipes escaped.
pub(super) fn cell(text: &str) -> String {
    let joined = text
        .split('\n')
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    joined.replace('|', "\\|")
}

/// One table row of the given cells (each made fit with `cell`; an empty one stays empty).
pub(super) fn row<S: AsRef<str>>(cells: &[S]) -> String {
    let cells: Vec<String> = cells
        .iter()
        .map(|c| match cell(c.as_ref()) {
            text if text.is_empty() => String::new(),
            text => format!(" {text} "),
        })
        .map(|c| if c.is_empty() { " ".to_owned() } else { c })
        .collect();
    format!("|{}|\n", cells.join("|"))
}

/// Text ending as a sentence: clap drops the final period of a one-paragraph doc comment.
pub(super) fn sentence(text: &str) -> String {
    let text = text.trim();
    if text.is_empty() || text.ends_with(['.', '!', '?', ':']) {
        text.to_owned()
    } else {
        format!("{text}.")
    }
}

/// Prose wrapped at 100 characters (the book's line length), paragraphs kept. A line never
/// starts with a character that would make it a list item, heading, quote or table row.
pub(super) fn wrap(text: &str) -> String {
    wrap_at(text, 100)
}

/// Prose wrapped at `width` characters, as `wrap`.
pub(super) fn wrap_at(text: &str, width: usize) -> String {
    let mut paragraphs = Vec::new();
    for paragraph in text.split("\n\n") {
        let words: Vec<&str> = paragraph.split_whitespace().collect();
        let mut lines: Vec<String> = Vec::new();
        let mut line = String::new();
        for word in words {
            let starts_block = word.starts_with(['-', '+', '*', '#', '>', '|', '='])
                || word
                    .trim_end_matches(['.', ')'])
                    .chars()
                    .all(|c| c.is_ascii_digit())
                    && word.ends_with(['.', ')']);
            if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width && !starts_block {
                lines.push(std::mem::take(&mut line));
            }
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(word);
        }
        if !line.is_empty() {
            lines.push(line);
        }
        paragraphs.push(lines.join("\n"));
    }
    paragraphs.join("\n\n")
}

/// The heading id mdBook gives a heading's text: lower case, alphanumerics, `-` and `_`
/// kept, spaces turned into `-`, everything else dropped.
pub(super) fn anchor(heading: &str) -> String {
    heading
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_ascii_lowercase()),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_without_starting_a_list() {
        let text = format!("{} - not a list item", "word ".repeat(19));
        for line in wrap(&text).lines() {
            assert!(line.chars().count() <= 100 || !line.contains(' '), "{line}");
            assert!(!line.starts_with('-'), "{line}");
        }
    }

    #[test]
    fn cells_hold_one_line_without_pipes() {
        assert_eq!(cell("a|b\n  c"), "a\\|b c");
    }

    #[test]
    fn rows_keep_empty_cells_compact() {
        assert_eq!(row(&["a", "", "b|c"]), "| a | | b\\|c |\n");
    }

    #[test]
    fn anchors_follow_mdbook() {
        assert_eq!(anchor("`spec.versions[].introduce`"), "specversionsintroduce");
        assert_eq!(anchor("The plan command"), "the-plan-command");
    }
}
