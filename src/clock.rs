//! The notion of now of the controller and of the webhook's rotation record.

use std::sync::Arc;

use jiff::Timestamp;

/// A source of the current instant (the wall clock, or a fixed one in tests).
pub type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;
