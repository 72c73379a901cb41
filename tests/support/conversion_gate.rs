//! A gate that holds conversions where the webhook runs them, so that a test decides when a
//! review in flight finishes instead of racing it: the policies' real conversions, except
//! that converting an object whose name starts with `held` first waits at the gate.

#![allow(dead_code)]

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crd_lifecycle::conversion::{Budget, ConversionError};
use crd_lifecycle::webhook::{Convert, Lookup, PolicySource};
use serde_json::Value;

/// How long a held conversion waits at most: only reached when the test failed (a gate
/// never opened, or a conversion blocking the thread that should open it), so that the
/// failure shows instead of a hang.
const HELD_AT_MOST: Duration = Duration::from_secs(20);

/// Holds conversions until opened.
#[derive(Default)]
pub struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
    /// Conversions that reached the gate so far.
    arrived: tokio::sync::watch::Sender<usize>,
}

impl Gate {
    /// Waits (blocking the thread, as a conversion does) until the gate opens.
    fn pass(&self) {
        self.arrived.send_modify(|n| *n += 1);
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let _ = self
            .opened
            .wait_timeout_while(open, HELD_AT_MOST, |open| !*open)
            .unwrap_or_else(|p| p.into_inner());
    }

    /// Completes once `count` conversions are held (or went through) the gate.
    pub async fn arrived(&self, count: usize) {
        let mut arrived = self.arrived.subscribe();
        let _ = arrived.wait_for(|n| *n >= count).await;
    }

    /// Lets every held conversion, and every later one, through.
    pub fn open(&self) {
        *self.open.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.opened.notify_all();
    }
}

/// `policies`, whose conversions of `held*` objects wait at `gate`.
pub struct GatedPolicies {
    pub policies: Arc<dyn PolicySource>,
    pub gate: Arc<Gate>,
}

impl PolicySource for GatedPolicies {
    fn converter(&self, policy: &str) -> Lookup {
        match self.policies.converter(policy) {
            Lookup::Found(converter) => Lookup::Found(Arc::new(Gated {
                converter,
                gate: self.gate.clone(),
            })),
            other => other,
        }
    }
}

struct Gated {
    converter: Arc<dyn Convert>,
    gate: Arc<Gate>,
}

impl Convert for Gated {
    fn convert_in_place(
        &self,
        object: &mut Value,
        to_version: &str,
        budget: &mut Budget,
    ) -> Result<(), ConversionError> {
        let name = object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if name.starts_with("held") {
            self.gate.pass();
        }
        self.converter.convert_in_place(object, to_version, budget)
    }
}
