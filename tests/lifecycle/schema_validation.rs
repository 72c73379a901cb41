//! The schema validator agrees with the apiserver: every case recorded from a real
//! kube-apiserver v1.36.2 (`tests/fixtures/schema-validation/apiserver-v1.36.2.txt`, whose
//! header says how) is accepted or rejected as the apiserver did, rejected at the fields it
//! named, and stored as it stored it.

use crd_lifecycle::schema::{Schema, served, validate};
use serde_json::{Value, json};

const RECORDED: &str = include_str!("../fixtures/schema-validation/apiserver-v1.36.2.txt");

fn recorded() -> Value {
    let body: String = RECORDED
        .lines()
        .filter(|line| !line.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    serde_json::from_str(&body).expect("the fixture is JSON after its header")
}

/// Equal as the apiserver stores them: numbers by value (3.0 is stored as 3).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

#[test]
fn the_validator_answers_every_recorded_case_as_the_apiserver_did() {
    let fixture = recorded();
    let schema = Schema::parse(&fixture["schema"]);
    let cases = fixture["cases"].as_array().expect("cases");
    assert!(cases.len() >= 60, "{} cases", cases.len());
    let mut disagreements = Vec::new();
    for case in cases {
        let name = case["case"].as_str().expect("name");
        let spec: Value = serde_json::from_str(case["spec"].as_str().expect("spec text")).expect("spec JSON");
        let object = json!({"apiVersion": "h3.example.com/v1", "kind": "Probe", "metadata": {"name": name}, "spec": spec});
        let problems = validate(&schema, &object);
        // The apiserver accepts an object with unknown fields (it prunes them and warns);
        // the validator reports them, as pruning loses them.
        let (pruned, rejected): (Vec<_>, Vec<_>) = problems
            .iter()
            .partition(|p| p.message.starts_with("unknown field"));
        let warned: Vec<String> = case["warnings"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|w| {
                let rest = w.as_str()?.split_once(r#"unknown field \""#)?.1;
                rest.split_once(r#"\""#).map(|(path, _)| path.to_owned())
            })
            .collect();
        let pruned_paths: Vec<String> = pruned.iter().map(|p| p.path.clone()).collect();
        if pruned_paths != warned {
            disagreements.push(format!(
                "{name}: pruned {pruned_paths:?}, the apiserver warned of {warned:?}"
            ));
        }
        match case["code"].as_u64() {
            Some(201) => {
                if !rejected.is_empty() {
                    disagreements.push(format!(
                        "{name}: accepted by the apiserver, rejected here: {rejected:?}"
                    ));
                }
                let stored = &served(&schema, &object)["spec"];
                if !same(stored, &case["stored"]) {
                    disagreements.push(format!(
                        "{name}: stored {}, served here as {stored}",
                        case["stored"]
                    ));
                }
            }
            Some(422) => {
                if rejected.is_empty() {
                    disagreements.push(format!(
                        "{name}: rejected by the apiserver ({}), accepted here",
                        case["message"]
                    ));
                }
                for field in case["causes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                {
                    if field != "<nil>" && !rejected.iter().any(|p| p.path == field) {
                        disagreements
                            .push(format!("{name}: the apiserver names {field}, here: {rejected:?}"));
                    }
                }
            }
            other => panic!("{name}: unexpected code {other:?}"),
        }
    }
    assert!(disagreements.is_empty(), "{}", disagreements.join("\n"));
}
