//! The wake step: when to reconcile again. At the next transition, so that it lands on its
//! instant; sooner when a held step may proceed by time alone or waits on a change nothing
//! watched here announces; at most at the resync interval.

use std::time::Duration;

use jiff::Timestamp;

use super::Reconciled;
use super::report::next_transition;
use crate::controller::Context;
use crate::controller::jobs::permissions::RECHECK_MISSING_AFTER;

/// When the policy's next reconcile is due (`None`: only at the resync).
pub fn next_wake(ctx: &Context, name: &str, reconciled: &Reconciled, now: Timestamp) -> Option<Timestamp> {
    let evaluation = reconciled.evaluation();
    let next = next_transition(evaluation);
    // Wake at the next transition, or when a held one may proceed by time alone.
    let wake_at = evaluation.and_then(|e| e.wake_at);
    // A missing grant is checked again soon (bounded backoff): granting it changes nothing
    // we watch. So is a wait on an outside change.
    let regrant = ctx
        .jobs
        .recheck_grant_after(name, reconciled.misses_permissions())
        .and_then(|delay| now.checked_add(delay).ok());
    let (recheck_soon, preflight_wake, writers_recheck) = match reconciled {
        Reconciled::Acted { applied, started } => {
            let decided = applied.decided.as_ref();
            (
                started.recheck_soon || decided.is_some_and(|d| d.waits_on_migrations()),
                started.preflight_wake,
                decided.and_then(|d| d.writers_recheck),
            )
        }
        Reconciled::Held { .. } => (false, None, None),
    };
    let recheck = recheck_soon
        .then(|| now.checked_add(RECHECK_MISSING_AFTER).ok())
        .flatten();
    [next, wake_at, regrant, recheck, preflight_wake, writers_recheck]
        .into_iter()
        .flatten()
        .min()
}

/// How long to wait before the next reconcile: until the next transition (so that it lands
/// on time), at most `resync`.
pub fn requeue_after(now: Timestamp, next: Option<Timestamp>, resync: Duration) -> Duration {
    let Some(next) = next else { return resync };
    let until = next.duration_since(now);
    if until.is_negative() {
        return Duration::ZERO;
    }
    // Round up to the millisecond (and one more) so that the reconcile never runs just
    // before the instant.
    let millis = u64::try_from((until.as_nanos() + 999_999) / 1_000_000).unwrap_or(u64::MAX);
    Duration::from_millis(millis.saturating_add(1)).min(resync)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(text: &str) -> Timestamp {
        text.parse().expect("instant")
    }

    #[test]
    fn requeues_at_the_next_transition() {
        let resync = Duration::from_secs(600);
        let now = ts("2026-01-01T00:00:00Z");
        assert_eq!(
            requeue_after(now, Some(ts("2026-01-01T00:00:05Z")), resync),
            Duration::from_millis(5001)
        );
        assert_eq!(
            requeue_after(now, Some(ts("2026-01-01T00:00:00.2504Z")), resync),
            Duration::from_millis(252)
        );
    }

    #[test]
    fn requeue_is_capped_by_resync_and_never_negative() {
        let resync = Duration::from_secs(600);
        let now = ts("2026-01-01T00:00:00Z");
        assert_eq!(
            requeue_after(now, Some(ts("2026-03-01T00:00:00Z")), resync),
            resync
        );
        assert_eq!(requeue_after(now, None, resync), resync);
        assert_eq!(
            requeue_after(now, Some(ts("2025-12-31T23:59:59Z")), resync),
            Duration::ZERO
        );
    }
}
