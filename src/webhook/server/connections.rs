//! How the webhook's connections age and how the webhook stops: the settings, and their
//! defaults.

use std::time::Duration;

/// How the webhook's connections age and how the webhook stops.
#[derive(Clone, Copy, Debug)]
pub struct Connections {
    /// After the shutdown signal: how long the webhook keeps serving, not ready, so that the
    /// Service's endpoints drop it before it stops accepting.
    pub drain: Duration,
    /// Once the webhook stops accepting (and whenever a connection reaches `max_age`):
    /// how long requests in flight get to finish before their connection is closed.
    pub in_flight_deadline: Duration,
    /// A connection older than this (give or take a tenth, so that connections opened
    /// together do not all close together) is asked to close gracefully: HTTP/2 GOAWAY,
    /// HTTP/1.1 `Connection: close` on its next response. The client opens a new one,
    /// which the Service may send to another replica. `None`: never.
    pub max_age: Option<Duration>,
    /// An HTTP/1.1 connection asked to close (past `max_age`, or the webhook stopping) that
    /// sits idle is closed by the webhook only once it has been idle this long, longer than
    /// its client keeps an idle connection: until then the client closes it, or sends one
    /// more request, answered with `Connection: close`. Closing an idle HTTP/1.1 connection
    /// any sooner can close it under a request the client has just sent, which Go's client
    /// (the apiserver's) does not retry for a POST and reports as `EOF`.
    pub idle_grace: Duration,
}

/// Default `drain`: endpoint changes reach kube-proxy (or the apiserver's own endpoint
/// resolver) within a few seconds.
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(10);
/// Default `in_flight_deadline`: a conversion's cost is bounded (see `Limits`); this is
/// for slow clients.
pub const DEFAULT_IN_FLIGHT_DEADLINE: Duration = Duration::from_secs(15);
/// Default `max_age`.
pub const DEFAULT_MAX_CONNECTION_AGE: Duration = Duration::from_secs(300);
/// Default `idle_grace`: Go's `http.Transport` closes a connection idle for 90 s
/// (`IdleConnTimeout` of `http.DefaultTransport`, which the apiserver's webhook clients
/// keep) and never reuses one idle for longer; 10 s more for a busy client to get to it.
pub const DEFAULT_IDLE_GRACE: Duration = Duration::from_secs(100);

impl Connections {
    /// `drain`, `max_age` (zero: connections never age out) and `idle_grace`, with the
    /// default deadline for requests in flight.
    pub fn new(drain: Duration, max_age: Duration, idle_grace: Duration) -> Connections {
        Connections {
            drain,
            in_flight_deadline: DEFAULT_IN_FLIGHT_DEADLINE,
            max_age: (!max_age.is_zero()).then_some(max_age),
            idle_grace,
        }
    }

    /// How long the webhook may take to stop once it stops accepting: requests in flight
    /// finish within `in_flight_deadline`, then idle HTTP/1.1 connections get `idle_grace`.
    pub fn closing_deadline(&self) -> Duration {
        self.in_flight_deadline + self.idle_grace
    }
}

impl Default for Connections {
    fn default() -> Connections {
        Connections {
            drain: DEFAULT_DRAIN,
            in_flight_deadline: DEFAULT_IN_FLIGHT_DEADLINE,
            max_age: Some(DEFAULT_MAX_CONNECTION_AGE),
            idle_grace: DEFAULT_IDLE_GRACE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_from_flags() {
        let connections = Connections::new(Duration::from_secs(7), Duration::ZERO, DEFAULT_IDLE_GRACE);
        assert_eq!(connections.max_age, None, "0s: connections never age out");
        assert_eq!(connections.drain, Duration::from_secs(7));
        assert_eq!(connections.in_flight_deadline, DEFAULT_IN_FLIGHT_DEADLINE);
        assert_eq!(connections.idle_grace, Duration::from_secs(100));
        assert_eq!(connections.closing_deadline(), Duration::from_secs(115));
        let aged = Connections::new(Duration::ZERO, Duration::from_secs(60), Duration::ZERO);
        assert_eq!(aged.max_age, Some(Duration::from_secs(60)));
        assert_eq!(aged.closing_deadline(), DEFAULT_IN_FLIGHT_DEADLINE);
    }
}
