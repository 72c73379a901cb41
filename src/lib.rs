//! crd-lifecycle: runs the life of CustomResourceDefinition versions as code.

pub mod adopt;
pub mod api;
pub mod audit;
pub mod check;
pub mod clock;
pub mod controller;
pub mod conversion;
pub mod conversion_test;
pub mod convert_objects;
pub mod field_errors;
mod kube_events;
pub mod kubeclient;
pub mod lifecycle;
pub mod manifest;
pub mod migrate;
pub mod plan;
pub mod re2;
pub mod schema;
pub mod signals;
mod supervise;
mod sync;
pub mod webhook;
