//! Declarative conversion: golden tests per change kind, a three-version chain, validation,
//! and property tests that round trips are lossless.

use crd_lifecycle::api::{AddedField, ConversionSpec, ConversionStep, RenamedField};
use crd_lifecycle::conversion::{CONVERSION_DATA_ANNOTATION, ConversionError, Converter};
use proptest::prelude::*;
use serde_json::{Value, json};

fn versions(names: &[&str]) -> Vec<String> {
    names.iter().map(|v| (*v).to_owned()).collect()
}

/// The issue's example: v1alpha1 → v1beta1 → v1.
fn example() -> ConversionSpec {
    serde_json::from_value(json!({
        "webhook": {"enabled": true},
        "changes": [
            {"from": "v1alpha1", "to": "v1beta1",
             "renamed": [{"from": "spec.size", "to": "spec.replicas"}],
             "added": [{"path": "spec.color", "default": "blue"}],
             "removed": ["spec.legacyMode"]},
            {"from": "v1beta1", "to": "v1",
             "renamed": [{"from": "spec.replicas", "to": "spec.scale.replicas"}]},
        ]
    }))
    .expect("conversion spec")
}

fn converter() -> Converter {
    Converter::new(&example(), &versions(&["v1alpha1", "v1beta1", "v1"]), &[]).expect("valid")
}

fn widget(version: &str, spec: Value) -> Value {
    json!({"apiVersion": format!("example.com/{version}"), "kind": "Widget",
           "metadata": {"name": "w1", "namespace": "ns1", "uid": "u1", "resourceVersion": "7"},
           "spec": spec})
}

#[test]
fn a_rename_moves_the_field_both_ways() {
    let c = converter();
    let beta = c
        .convert(&widget("v1alpha1", json!({"size": 3})), "v1beta1")
        .expect("up");
    assert_eq!(beta, widget("v1beta1", json!({"replicas": 3, "color": "blue"})));
    let alpha = c.convert(&beta, "v1alpha1").expect("down");
    assert_eq!(alpha, widget("v1alpha1", json!({"size": 3})));
}

#[test]
fn an_added_field_takes_its_default_and_survives_a_trip_down() {
    let c = converter();
    let red = widget("v1beta1", json!({"replicas": 1, "color": "red"}));
    let alpha = c.convert(&red, "v1alpha1").expect("down");
    let saved = alpha["metadata"]["annotations"][CONVERSION_DATA_ANNOTATION]
        .as_str()
        .expect("saved");
    assert_eq!(
        serde_json::from_str::<Value>(saved).expect("json"),
        json!({"v1beta1": {"values": {"spec.color": "red"}}})
    );
    assert_eq!(alpha["spec"], json!({"size": 1}));
    assert_eq!(
        c.convert(&alpha, "v1beta1").expect("up"),
        red,
        "restored, annotation gone"
    );
    // The default needs no saving.
    let blue = widget("v1beta1", json!({"replicas": 1, "color": "blue"}));
    let alpha = c.convert(&blue, "v1alpha1").expect("down");
    assert!(alpha["metadata"].get("annotations").is_none(), "{alpha}");
    // An absent added field stays absent through a round trip.
    let colourless = widget("v1beta1", json!({"replicas": 1}));
    let alpha = c.convert(&colourless, "v1alpha1").expect("down");
    assert_eq!(c.convert(&alpha, "v1beta1").expect("up"), colourless);
}

#[test]
fn a_removed_field_is_kept_in_the_annotation() {
    let c = converter();
    let original = widget("v1alpha1", json!({"size": 2, "legacyMode": {"on": true}}));
    let beta = c.convert(&original, "v1beta1").expect("up");
    assert!(beta["spec"].get("legacyMode").is_none());
    let saved = beta["metadata"]["annotations"][CONVERSION_DATA_ANNOTATION]
        .as_str()
        .expect("saved");
    assert_eq!(
        serde_json::from_str::<Value>(saved).expect("json"),
        json!({"v1alpha1": {"values": {"spec.legacyMode": {"on": true}}}})
    );
    assert_eq!(c.convert(&beta, "v1alpha1").expect("down"), original);
}

#[test]
fn a_chain_of_three_versions_converts_up_and_down() {
    let c = converter();
    let original = widget("v1alpha1", json!({"size": 5, "legacyMode": true, "note": "kept"}));
    let ga = c.convert(&original, "v1").expect("up two steps");
    assert_eq!(ga["apiVersion"], "example.com/v1");
    assert_eq!(
        ga["spec"],
        json!({"scale": {"replicas": 5}, "color": "blue", "note": "kept"})
    );
    assert_eq!(c.convert(&ga, "v1alpha1").expect("down two steps"), original);
    // Other annotations and metadata are untouched.
    let mut annotated = original.clone();
    annotated["metadata"]["annotations"] = json!({"team": "a"});
    let back = c
        .convert(&c.convert(&annotated, "v1").expect("up"), "v1alpha1")
        .expect("down");
    assert_eq!(back, annotated);
    // The same version: nothing changes.
    assert_eq!(c.convert(&ga, "v1").expect("same"), ga);
}

#[test]
fn empty_parents_come_back_exactly() {
    let c = converter();
    // `spec: {}` up (the default is added) and back: `spec` stays, empty.
    let empty = widget("v1alpha1", json!({}));
    let up = c.convert(&empty, "v1").expect("up");
    assert_eq!(up["spec"], json!({"color": "blue"}));
    assert_eq!(c.convert(&up, "v1alpha1").expect("down"), empty);
    // No spec at all: the one converting up created goes again on the way back.
    let mut bare = widget("v1alpha1", json!({}));
    bare.as_object_mut().expect("object").remove("spec");
    let up = c.convert(&bare, "v1beta1").expect("up");
    assert_eq!(up["spec"], json!({"color": "blue"}));
    assert_eq!(c.convert(&up, "v1alpha1").expect("down"), bare);
}

#[test]
fn a_removed_only_field_leaves_its_parent() {
    // A schema with `required: [spec]` must still accept the converted object.
    let c = converter();
    let only_removed = widget("v1alpha1", json!({"legacyMode": true}));
    let beta = c.convert(&only_removed, "v1beta1").expect("up");
    assert_eq!(beta["spec"], json!({"color": "blue"}));
    let spec_only_legacy = Converter::new(
        &serde_json::from_value(
            json!({"changes": [{"from": "v1alpha1", "to": "v1beta1", "removed": ["spec.legacyMode"]}]}),
        )
        .expect("spec"),
        &versions(&["v1alpha1", "v1beta1"]),
        &[],
    )
    .expect("valid");
    let beta = spec_only_legacy.convert(&only_removed, "v1beta1").expect("up");
    assert_eq!(beta["spec"], json!({}), "spec kept, empty");
    assert_eq!(
        spec_only_legacy.convert(&beta, "v1alpha1").expect("down"),
        only_removed
    );
}

#[test]
fn a_rename_into_a_new_parent_leaves_nothing_behind() {
    let c = converter();
    let ga = widget("v1", json!({"scale": {"replicas": 2}, "color": "red"}));
    let beta = c.convert(&ga, "v1beta1").expect("down");
    assert_eq!(
        beta["spec"],
        json!({"replicas": 2, "color": "red"}),
        "no empty scale left"
    );
    assert_eq!(c.convert(&beta, "v1").expect("up"), ga);
}

#[test]
fn objects_that_cannot_convert_say_why() {
    let c = converter();
    let taken = widget("v1alpha1", json!({"size": 1, "replicas": 2}));
    assert_eq!(
        c.convert(&taken, "v1beta1"),
        Err(ConversionError::TargetTaken {
            from: "spec.size".into(),
            to: "spec.replicas".into()
        })
    );
    let unknown = widget("v2", json!({}));
    assert!(matches!(
        c.convert(&unknown, "v1"),
        Err(ConversionError::UnknownVersion { .. })
    ));
    assert!(matches!(
        c.convert(&widget("v1", json!({})), "v9"),
        Err(ConversionError::UnknownVersion { .. })
    ));
    assert_eq!(
        c.convert(&json!({"kind": "Widget"}), "v1"),
        Err(ConversionError::NoApiVersion)
    );
    let mut bad = widget("v1beta1", json!({}));
    bad["metadata"]["annotations"] = json!({CONVERSION_DATA_ANNOTATION: "{not json"});
    assert!(matches!(
        c.convert(&bad, "v1alpha1"),
        Err(ConversionError::BadAnnotation(_))
    ));
}

#[test]
fn validation_names_the_field() {
    let spec: ConversionSpec = serde_json::from_value(json!({
        "changes": [
            {"from": "v1alpha1", "to": "v1beta1", "renamed": [{"from": "spec.a", "to": "spec..b"}], "removed": ["spec.a"]},
            {"from": "v1", "to": "v2"},
        ]
    }))
    .expect("spec");
    let Err(errors) = Converter::new(&spec, &versions(&["v1alpha1", "v1beta1", "v1"]), &[]) else {
        panic!("invalid chain accepted")
    };
    let found: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    let expect = [
        "spec.conversion.changes[0].renamed[0].to: \"spec..b\" is not a field path",
        "spec.conversion.changes[1].from: steps must form one chain",
        "spec.conversion.changes[1].to: v2 is not a version of the CRD",
    ];
    for expected in expect {
        assert!(
            found.iter().any(|f| f.starts_with(expected)),
            "missing {expected:?} in {found:#?}"
        );
    }
    let spec: ConversionSpec = serde_json::from_value(json!({
        "changes": [{"from": "v1alpha1", "to": "v1beta1", "renamed": [{"from": "spec.a", "to": "spec.b"}], "removed": ["spec.b"]}]
    }))
    .expect("spec");
    let Err(errors) = Converter::new(&spec, &versions(&["v1alpha1", "v1beta1", "v1"]), &[]) else {
        panic!("accepted")
    };
    let found: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    assert!(
        found
            .iter()
            .any(|f| f
                .starts_with("spec.conversion.changes[0].removed[0]: spec.b is both renamed and removed"))
    );
    assert!(
        found.iter().any(|f| f.contains("does not reach version v1")),
        "{found:#?}"
    );
}

// ---- property tests ----

/// A generated chain: for each version, the fields (leaf paths) its objects may have.
#[derive(Debug, Clone)]
struct Chain {
    spec: ConversionSpec,
    fields: Vec<Vec<String>>,
}

/// Builds `n` versions; each step removes, renames and adds some fields. Fresh names are
/// unique leaves (`spec.f7`, `spec.g7.x`), so paths never overlap.
fn chain() -> impl Strategy<Value = Chain> {
    (2usize..=4, proptest::collection::vec(any::<[u8; 6]>(), 3)).prop_map(|(n, choices)| {
        let mut counter = 0;
        let mut fresh = |nested: bool| {
            counter += 1;
            if nested {
                format!("spec.g{counter}.x")
            } else {
                format!("spec.f{counter}")
            }
        };
        let mut fields: Vec<Vec<String>> = vec![(0..3).map(|i| fresh(i == 2)).collect()];
        let mut changes = Vec::new();
        for step in 0..n - 1 {
            let c = choices[step % choices.len()];
            let mut current = fields[step].clone();
            let mut removed = Vec::new();
            let mut renamed = Vec::new();
            let mut added = Vec::new();
            if c[0] % 2 == 0 && !current.is_empty() {
                removed.push(current.remove(usize::from(c[1]) % current.len()));
            }
            if c[2] % 2 == 0 && !current.is_empty() {
                let from = current.remove(usize::from(c[3]) % current.len());
                let to = fresh(c[4] % 2 == 0);
                renamed.push(RenamedField { from, to: to.clone() });
                current.push(to);
            }
            if c[5] % 3 != 0 {
                let path = fresh(c[5] % 2 == 0);
                added.push(AddedField {
                    path: path.clone(),
                    default: json!(format!("default-{step}")),
                });
                current.push(path);
            }
            changes.push(ConversionStep {
                from: format!("v{step}"),
                to: format!("v{}", step + 1),
                renamed,
                added,
                removed,
                changed: Vec::new(),
                accept_loss: Vec::new(),
            });
            fields.push(current);
        }
        Chain {
            spec: ConversionSpec {
                changes,
                ..ConversionSpec::default()
            },
            fields,
        }
    })
}

fn value() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::from),
        "[a-z]{0,6}".prop_map(Value::from),
        any::<bool>().prop_map(Value::from),
        Just(json!("default-0")),
        proptest::collection::vec(any::<u8>(), 0..3).prop_map(|v| json!(v)),
    ]
}

/// A chain, a version of it, and an object of that version (a random subset of its fields).
fn case() -> impl Strategy<Value = (Chain, usize, Value, usize)> {
    chain().prop_flat_map(|chain| {
        let versions = chain.fields.len();
        (Just(chain), 0..versions, 0..versions).prop_flat_map(|(chain, from, to)| {
            let fields = chain.fields[from].clone();
            let count = fields.len();
            (
                Just(chain),
                Just(from),
                proptest::collection::vec(proptest::option::of(value()), count),
                Just(to),
                0..3usize,
                proptest::collection::vec(any::<bool>(), count),
            )
                .prop_map(move |(chain, from, values, to, base, empty_parents)| {
                    // Empty and near-empty objects too: no spec, `spec: {}`, or one field more.
                    let mut object = json!({"apiVersion": format!("example.com/v{from}"), "kind": "Widget",
                                            "metadata": {"name": "w"}});
                    match base {
                        0 => {}
                        1 => object["spec"] = json!({}),
                        _ => object["spec"] = json!({"keep": 1}),
                    }
                    for ((path, value), empty_parent) in fields.iter().zip(values).zip(&empty_parents) {
                        let path = crd_lifecycle::conversion::FieldPath::parse(path).expect("path");
                        match value {
                            Some(value) => path.set(&mut object, value).expect("set"),
                            // A nested field's parent, present but empty (`spec.g3: {}`).
                            None if *empty_parent && path.depth() > 2 => {
                                let parent = path.to_string();
                                let parent = parent.rsplit_once('.').map(|(p, _)| p).unwrap_or_default();
                                crd_lifecycle::conversion::FieldPath::parse(parent)
                                    .expect("parent")
                                    .set(&mut object, json!({}))
                                    .expect("set");
                            }
                            None => {}
                        }
                    }
                    (chain, from, object, to)
                })
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn a_round_trip_gives_back_the_original((chain, _from, object, to) in case()) {
        let names: Vec<String> = (0..chain.fields.len()).map(|i| format!("v{i}")).collect();
        let converter = Converter::new(&chain.spec, &names, &[]).expect("valid chain");
        let there = converter.convert(&object, &names[to]).expect("converts");
        prop_assert_eq!(&there["apiVersion"], &json!(format!("example.com/{}", names[to])));
        let back = converter.convert(&there, object["apiVersion"].as_str().and_then(|a| a.rsplit('/').next()).expect("version"))
            .expect("converts back");
        prop_assert_eq!(&back, &object, "via {}: {}", names[to], there);
        // Converting in two hops equals converting at once.
        for middle in &names {
            let hop = converter.convert(&converter.convert(&object, middle).expect("hop"), &names[to]).expect("hop");
            let direct_back = converter.convert(&hop, object["apiVersion"].as_str().and_then(|a| a.rsplit('/').next()).expect("v")).expect("back");
            prop_assert_eq!(&direct_back, &object);
        }
    }
}

#[test]
fn field_paths_follow_renames_across_the_chain() {
    let c = converter();
    let path = |p: &str| p.split('.').map(str::to_owned).collect::<Vec<_>>();
    // Up: size → replicas → scale.replicas; a removed field has no counterpart.
    assert_eq!(
        c.translate_path(&path("spec.size"), "v1alpha1", "v1"),
        Some(path("spec.scale.replicas"))
    );
    assert_eq!(c.translate_path(&path("spec.legacyMode"), "v1alpha1", "v1"), None);
    assert_eq!(
        c.translate_path(&path("spec.note"), "v1alpha1", "v1"),
        Some(path("spec.note"))
    );
    // Down: back the same way; a field added later has none.
    assert_eq!(
        c.translate_path(&path("spec.scale.replicas"), "v1", "v1alpha1"),
        Some(path("spec.size"))
    );
    assert_eq!(c.translate_path(&path("spec.color"), "v1", "v1alpha1"), None);
    // A version outside the chain: unchanged.
    assert_eq!(
        c.translate_path(&path("spec.size"), "v0", "v1"),
        Some(path("spec.size"))
    );
}

// ---- type changes (`changed[]`, CEL) ----

fn port_chain(extra: Value) -> Converter {
    let mut step = json!({"from": "v1alpha1", "to": "v1",
                          "changed": [{"path": "spec.port", "upgrade": "int(self)", "downgrade": "string(self)"}]});
    if let (Some(step), Some(extra)) = (step.as_object_mut(), extra.as_object()) {
        step.extend(extra.clone());
    }
    let spec: ConversionSpec = serde_json::from_value(json!({"changes": [step]})).expect("spec");
    Converter::new(&spec, &versions(&["v1alpha1", "v1"]), &[]).expect("valid")
}

#[test]
fn a_type_change_converts_both_ways_and_keeps_what_a_round_trip_would_lose() {
    let c = port_chain(json!({}));
    let plain = widget("v1alpha1", json!({"port": "8080"}));
    let up = c.convert(&plain, "v1").expect("converts");
    assert_eq!(up["spec"]["port"], json!(8080));
    assert!(up["metadata"]["annotations"].is_null(), "nothing to keep: {up}");
    assert_eq!(c.convert(&up, "v1alpha1").expect("back"), plain);

    // "08080" → 8080 → "8080" would lose the zero: the original is kept and comes back.
    let padded = widget("v1alpha1", json!({"port": "08080"}));
    let up = c.convert(&padded, "v1").expect("converts");
    assert_eq!(up["spec"]["port"], json!(8080));
    assert_eq!(
        up["metadata"]["annotations"][CONVERSION_DATA_ANNOTATION],
        json!(r#"{"v1alpha1":{"changed":{"spec.port":"08080"}}}"#)
    );
    assert_eq!(c.convert(&up, "v1alpha1").expect("back"), padded);

    // Changed in v1 since: the kept original is stale, so the new value converts.
    let mut edited = up.clone();
    edited["spec"]["port"] = json!(9090);
    let back = c.convert(&edited, "v1alpha1").expect("back");
    assert_eq!(back["spec"]["port"], json!("9090"));
    assert!(back["metadata"]["annotations"].is_null(), "{back}");

    // A missing field stays missing.
    let none = widget("v1alpha1", json!({"size": 1}));
    assert_eq!(
        c.convert(&none, "v1").expect("converts")["spec"],
        json!({"size": 1})
    );
}

#[test]
fn a_value_the_expression_cannot_convert_fails_naming_the_path_and_the_error() {
    let c = port_chain(json!({}));
    let error = c
        .convert(&widget("v1alpha1", json!({"port": "http"})), "v1")
        .expect_err("int(\"http\")");
    let ConversionError::Expression {
        ref path,
        direction,
        ref expression,
        ..
    } = error
    else {
        panic!("{error:?}")
    };
    assert_eq!(
        (path.as_str(), direction, expression.as_str()),
        ("spec.port", "upgrade", "int(self)")
    );
    let message = error.to_string();
    assert!(
        message.starts_with(r#"spec.port: upgrade `int(self)` failed on "http": "#),
        "{message}"
    );
}

#[test]
fn rename_then_change_on_one_field() {
    // spec.portName (a string) becomes spec.port (an integer): the change names the new path.
    let c = port_chain(json!({"renamed": [{"from": "spec.portName", "to": "spec.port"}]}));
    let old = widget("v1alpha1", json!({"portName": "08443"}));
    let up = c.convert(&old, "v1").expect("converts");
    assert_eq!(up["spec"], json!({"port": 8443}));
    assert_eq!(c.convert(&up, "v1alpha1").expect("back"), old);
}

#[test]
fn type_changes_are_validated_with_field_paths() {
    let spec: ConversionSpec = serde_json::from_value(json!({"changes": [
        {"from": "v1alpha1", "to": "v1beta1",
         "renamed": [{"from": "spec.a", "to": "spec.b"}],
         "removed": ["spec.gone"],
         "changed": [
            {"path": "spec.a", "upgrade": "int(self)", "downgrade": "string(self)"},
            {"path": "spec.c", "upgrade": "int(", "downgrade": "other"},
            {"path": "spec.gone", "upgrade": "self", "downgrade": "self"},
            {"path": "spec.d", "upgrade": "self.lowerascii()", "downgrade": "self"},
         ]},
        {"from": "v1beta1", "to": "v1"},
    ]}))
    .expect("spec");
    let Err(errors) = Converter::new(&spec, &versions(&["v1alpha1", "v1beta1", "v1"]), &[]) else {
        panic!("accepted")
    };
    let found: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    for expected in [
        "spec.conversion.changes[0].changed[0].path: spec.a is also renamed from in this step",
        "spec.conversion.changes[0].changed[1].upgrade: does not compile",
        "spec.conversion.changes[0].changed[1].downgrade: unknown name other: only self is available",
        "spec.conversion.changes[0].changed[2].path: spec.gone is also removed in this step",
        "spec.conversion.changes[0].changed[3].upgrade: unknown function lowerascii (did you mean lowerAscii?)",
    ] {
        assert!(
            found.iter().any(|f| f.starts_with(expected)),
            "missing {expected:?} in {found:#?}"
        );
    }
}

#[test]
fn a_type_change_keeps_the_path_so_managed_fields_need_no_translation() {
    let c = port_chain(json!({}));
    let path = vec!["spec".to_owned(), "port".to_owned()];
    assert_eq!(c.translate_path(&path, "v1alpha1", "v1"), Some(path.clone()));
    assert_eq!(c.translate_path(&path, "v1", "v1alpha1"), Some(path));
}

/// Type changes the property test draws: invertible, lossy (the original must be kept),
/// and failing on some values.
const CHANGES: [(&str, &str); 5] = [
    ("[self]", "self[0]"),
    ("string(self)", "int(self)"),
    ("int(self)", "string(self)"),
    ("string(self)", "self"),
    ("{'v': self}", "self.v"),
];

fn changed_case() -> impl Strategy<Value = (usize, Value)> {
    (
        0..CHANGES.len(),
        prop_oneof![
            any::<i64>().prop_map(Value::from),
            "0{0,2}[0-9]{1,4}".prop_map(Value::from),
            "[a-z]{0,4}".prop_map(Value::from),
            any::<bool>().prop_map(Value::from),
            Just(json!([1, "a"])),
        ],
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Converting up then back gives the original exactly, whether the change is invertible
    /// or not; a value the expression cannot take fails with an expression error and is
    /// never half-converted.
    #[test]
    fn type_changes_round_trip_or_fail_cleanly((which, value) in changed_case(), keep in any::<bool>()) {
        let (upgrade, downgrade) = CHANGES[which];
        let spec: ConversionSpec = serde_json::from_value(json!({"changes": [
            {"from": "v0", "to": "v1", "changed": [{"path": "spec.x", "upgrade": upgrade, "downgrade": downgrade}]},
            {"from": "v1", "to": "v2", "renamed": [{"from": "spec.x", "to": "spec.y"}]},
        ]})).expect("spec");
        let c = Converter::new(&spec, &versions(&["v0", "v1", "v2"]), &[]).expect("valid");
        let mut object = widget("v0", json!({"x": value}));
        if keep {
            object["spec"]["other"] = json!(1);
        }
        match c.convert(&object, "v2") {
            Ok(there) => {
                prop_assert!(there["spec"].get("x").is_none());
                let back = c.convert(&there, "v0").expect("back");
                prop_assert_eq!(&back, &object, "via {}", there);
            }
            Err(ConversionError::Expression { path, direction, .. }) => {
                prop_assert_eq!(path, "spec.x");
                prop_assert_eq!(direction, "upgrade");
            }
            Err(other) => prop_assert!(false, "{:?}", other),
        }
    }
}

// ---- schema coverage, property tests ----

/// The schema of a version whose objects may have `fields` (string leaves; a nested field's
/// parent requires it, so that no object holds an empty parent).
fn schema_for(fields: &[String]) -> Value {
    // Every version has a `spec`, even one with no fields (an empty object the object
    // holds is then kept, not pruned: the limit the book states (docs/src/concepts/conversion.md) for parents only one
    // version has).
    let mut root = json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {}}}});
    for path in fields {
        let mut node = &mut root;
        for segment in path.split('.') {
            node = node["properties"]
                .as_object_mut()
                .expect("properties")
                .entry(segment.to_owned())
                .or_insert_with(|| json!({"type": "object", "properties": {}}));
        }
        *node = json!({"type": "string"});
    }
    // A nested parent (below spec) requires its fields.
    fn require_children(node: &mut Value, depth: usize) {
        let Some(properties) = node.get_mut("properties").and_then(Value::as_object_mut) else {
            return;
        };
        let names: Vec<String> = properties.keys().cloned().collect();
        for child in properties.values_mut() {
            require_children(child, depth + 1);
        }
        if depth >= 2 {
            node["required"] = json!(names);
        }
    }
    require_children(&mut root, 0);
    root
}

fn chain_crd(chain: &Chain) -> crd_lifecycle::conversion_test::Crd {
    let versions: Vec<String> = (0..chain.fields.len()).map(|i| format!("v{i}")).collect();
    crd_lifecycle::conversion_test::Crd {
        group: "example.com".into(),
        kind: "Widget".into(),
        namespaced: true,
        schemas: versions
            .iter()
            .zip(&chain.fields)
            .map(|(v, fields)| {
                (
                    v.clone(),
                    crd_lifecycle::schema::Schema::parse(&schema_for(fields)),
                )
            })
            .collect(),
        versions,
        accepted_losses: Vec::new(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// For generated schemas and generated policies: coverage holds exactly when every
    /// field difference has its rule, and then every object generated from every version's
    /// schema converts to every other version (fitting its schema) and back exactly.
    #[test]
    fn test_passes_exactly_when_coverage_holds(chain in chain(), seed in any::<u64>(), drop in any::<usize>()) {
        let crd = chain_crd(&chain);
        let converter = Converter::new(&chain.spec, &crd.versions, &[]).expect("valid chain");
        let problems = crd_lifecycle::conversion::coverage::check(&chain.spec, &converter, &crd.schemas);
        prop_assert!(problems.is_empty(), "{}", problems);
        let mut rng = crd_lifecycle::schema::Rng::new(seed);
        for version in &crd.versions {
            for i in 0..8 {
                let fields = crd_lifecycle::schema::generate(&crd.schemas[version], &mut rng).expect("generated");
                let object = crd.object(version, &format!("o{i}"), fields);
                let checked = crd_lifecycle::conversion_test::check(&converter, &crd, &object);
                prop_assert!(checked.is_ok(), "{:?}", checked.err());
            }
        }
        // Without any one of its rules, coverage fails.
        let rules: usize = chain.spec.changes.iter().map(|s| s.renamed.len() + s.added.len() + s.removed.len()).sum();
        if rules > 0 {
            let mut spec = chain.spec.clone();
            let mut pick = drop % rules;
            'steps: for step in &mut spec.changes {
                for list in 0..3 {
                    let len = match list { 0 => step.renamed.len(), 1 => step.added.len(), _ => step.removed.len() };
                    if pick < len {
                        match list { 0 => { step.renamed.remove(pick); } 1 => { step.added.remove(pick); } _ => { step.removed.remove(pick); } }
                        break 'steps;
                    }
                    pick -= len;
                }
            }
            let converter = Converter::new(&spec, &crd.versions, &[]).expect("still a chain");
            let problems = crd_lifecycle::conversion::coverage::check(&spec, &converter, &crd.schemas);
            prop_assert!(!problems.is_empty(), "dropping a rule of {:?} went unnoticed", chain.spec);
        }
    }
}

// ---- what a downgrade cannot hold comes back (issue 29, finding 8) ----

fn chain_of(step: Value) -> Converter {
    let spec: ConversionSpec = serde_json::from_value(json!({"changes": [step]})).expect("spec");
    Converter::new(&spec, &versions(&["v1", "v2"]), &[]).expect("valid")
}

fn saved_of(object: &Value) -> Option<Value> {
    object["metadata"]["annotations"][CONVERSION_DATA_ANNOTATION]
        .as_str()
        .map(|text| serde_json::from_str(text).expect("the annotation is JSON"))
}

/// v2 widens v1's integer port to a string; narrowing it back loses what an integer cannot
/// say. Going down, the v2 value is kept whenever `upgrade(downgrade(x)) != x`, and comes
/// back while v1's value is still what it became; an edit in v1 wins.
#[test]
fn a_lossy_downgrade_keeps_the_newer_value_and_gives_it_back() {
    let c = chain_of(json!({"from": "v1", "to": "v2", "changed": [{
        "path": "spec.port", "upgrade": "string(self)",
        "downgrade": "self.matches('^[0-9]+$') ? int(self) : 0"}]}));
    for written in ["08080", "http", "8080"] {
        let v2 = widget("v2", json!({"port": written}));
        let v1 = c.convert(&v2, "v1").expect("down");
        let lossy = written != "8080";
        assert_eq!(saved_of(&v1).is_some(), lossy, "{written}: {v1}");
        assert_eq!(
            c.convert(&v1, "v2").expect("up"),
            v2,
            "{written} comes back exactly"
        );
    }
    let v1 = c
        .convert(&widget("v2", json!({"port": "08080"})), "v1")
        .expect("down");
    assert_eq!(v1["spec"]["port"], json!(8080));
    assert_eq!(
        saved_of(&v1),
        Some(json!({"v2": {"changed": {"spec.port": "08080"}}}))
    );
    // Edited in v1 since: the kept value is stale, the new one converts.
    let mut edited = v1.clone();
    edited["spec"]["port"] = json!(9090);
    let back = c.convert(&edited, "v2").expect("up");
    assert_eq!(back, widget("v2", json!({"port": "9090"})));
}

/// The issue's example: v2 adds `spec.ports[].appProtocol`. Declared as added in the list's
/// items, each item's value is kept going down and comes back to the same item going up:
/// matched by the list's key (`[port]`) wherever a client in v1 moved it, or by position.
#[test]
fn a_field_added_to_list_items_survives_a_trip_down() {
    let keyed = chain_of(json!({"from": "v1", "to": "v2",
        "added": [{"path": "spec.ports[port].appProtocol", "default": "tcp"}]}));
    let v2 = widget(
        "v2",
        json!({"ports": [
        {"port": 80, "appProtocol": "http"}, {"port": 443, "appProtocol": "tcp"}, {"port": 8443}]}),
    );
    let v1 = keyed.convert(&v2, "v1").expect("down");
    assert_eq!(
        v1["spec"],
        json!({"ports": [{"port": 80}, {"port": 443}, {"port": 8443}]})
    );
    assert_eq!(
        keyed.convert(&v1, "v2").expect("up"),
        v2,
        "exactly, defaults and absences too"
    );
    // A client of v1 inserts a port in front and drops 443: each item keeps its own.
    let mut moved = v1.clone();
    moved["spec"]["ports"] = json!([{"port": 9000}, {"port": 8443}, {"port": 80}]);
    let up = keyed.convert(&moved, "v2").expect("up");
    assert_eq!(
        up["spec"]["ports"],
        json!([{"port": 9000, "appProtocol": "tcp"}, {"port": 8443}, {"port": 80, "appProtocol": "http"}])
    );
    assert!(saved_of(&up).is_none(), "nothing left behind: {up}");

    let positional = chain_of(json!({"from": "v1", "to": "v2",
        "added": [{"path": "spec.ports[].appProtocol", "default": "tcp"}]}));
    let v1 = positional.convert(&v2, "v1").expect("down");
    assert_eq!(positional.convert(&v1, "v2").expect("up"), v2);
}

/// Removed and renamed inside list items, and a type change of an item's field: the same
/// round trips, through nested lists.
#[test]
fn rules_reach_into_nested_list_items() {
    let c = chain_of(json!({"from": "v1", "to": "v2",
        "renamed": [{"from": "spec.groups[].ports[port].name", "to": "spec.groups[].ports[port].portName"}],
        "removed": ["spec.groups[].ports[port].legacy"],
        "changed": [{"path": "spec.groups[].ports[port].weight", "upgrade": "string(self)", "downgrade": "int(self)"}]}));
    let v1 = widget(
        "v1",
        json!({"groups": [
        {"ports": [{"port": 80, "name": "web", "legacy": true, "weight": 1}]},
        {"ports": [{"port": 80, "weight": 2}, {"port": 81, "name": "alt"}]}]}),
    );
    let v2 = c.convert(&v1, "v2").expect("up");
    assert_eq!(
        v2["spec"],
        json!({"groups": [
        {"ports": [{"port": 80, "portName": "web", "weight": "1"}]},
        {"ports": [{"port": 80, "weight": "2"}, {"port": 81, "portName": "alt"}]}]})
    );
    assert_eq!(c.convert(&v2, "v1").expect("down"), v1);
    // "007" narrows to 7: kept for its item.
    let mut padded = v2.clone();
    padded["spec"]["groups"][1]["ports"][0]["weight"] = json!("007");
    let down = c.convert(&padded, "v1").expect("down");
    assert_eq!(down["spec"]["groups"][1]["ports"][0]["weight"], json!(7));
    assert_eq!(c.convert(&down, "v2").expect("up"), padded);
}

/// A type change of a whole list whose downgrade drops what the older items cannot hold:
/// kept, unless the policy accepts to lose it.
#[test]
fn a_downgrade_that_drops_fields_keeps_them_unless_their_loss_is_accepted() {
    let rule = json!({"path": "spec.ports", "upgrade": "self", "downgrade": "self.map(p, {'port': p.port})"});
    let v2 = widget("v2", json!({"ports": [{"port": 80, "appProtocol": "http"}]}));
    let kept = chain_of(json!({"from": "v1", "to": "v2", "changed": [rule.clone()]}));
    let v1 = kept.convert(&v2, "v1").expect("down");
    assert_eq!(v1["spec"]["ports"], json!([{"port": 80}]));
    assert_eq!(kept.convert(&v1, "v2").expect("up"), v2);

    let accepted = chain_of(json!({"from": "v1", "to": "v2", "changed": [rule],
        "acceptLoss": [{"path": "spec.ports[].appProtocol", "reason": "v1 clients never set it"}]}));
    let v1 = accepted.convert(&v2, "v1").expect("down");
    assert!(saved_of(&v1).is_none(), "dropped on purpose: {v1}");
    assert_eq!(
        accepted.convert(&v1, "v2").expect("up")["spec"]["ports"],
        json!([{"port": 80}])
    );
}

/// What is kept may not push the object's annotations over what the apiserver allows
/// (recorded: tests/fixtures/conversion-data/): the conversion fails, naming the sizes,
/// instead of the apiserver failing the read.
#[test]
fn what_is_kept_stays_within_the_apiservers_annotation_limit() {
    let recorded = include_str!("../fixtures/conversion-data/annotation-size-v1.36.2.txt");
    let body: String = recorded
        .lines()
        .filter(|l| !l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    let cases: Value = serde_json::from_str(&body).expect("fixture");
    let accepted = cases[0]["annotationBytes"].as_u64().expect("bytes") as usize;
    assert_eq!(cases[0]["code"], 201);
    assert_eq!(cases[1]["code"], 422);
    assert_eq!(cases[1]["annotationBytes"].as_u64(), Some(accepted as u64 + 1));
    assert_eq!(crd_lifecycle::conversion::MAX_ANNOTATIONS_BYTES, accepted);

    let c = chain_of(json!({"from": "v1", "to": "v2", "added": [{"path": "spec.notes", "default": ""}]}));
    // The annotation holds {"v2":{"values":{"spec.notes":"..."}}}: 37 bytes around the text.
    let around = CONVERSION_DATA_ANNOTATION.len() + r#"{"v2":{"values":{"spec.notes":""}}}"#.len();
    let fits = widget("v2", json!({"notes": "n".repeat(accepted - around)}));
    let down = c.convert(&fits, "v1").expect("exactly at the limit");
    assert_eq!(c.convert(&down, "v2").expect("up"), fits);
    let over = widget("v2", json!({"notes": "n".repeat(accepted - around + 1)}));
    let error = c.convert(&over, "v1").expect_err("one byte over");
    assert!(matches!(error, ConversionError::SavedTooLarge { .. }), "{error}");
    assert!(error.to_string().contains("262144"), "{error}");
    // Other annotations count too.
    let mut annotated = fits.clone();
    annotated["metadata"]["annotations"] = json!({"a": "b"});
    assert!(c.convert(&annotated, "v1").is_err());
}

/// Paths into list items are validated with the rest.
#[test]
fn list_item_paths_are_validated() {
    let spec: ConversionSpec = serde_json::from_value(json!({"changes": [{"from": "v1", "to": "v2",
        "renamed": [{"from": "spec.ports[].name", "to": "spec.names"},
                    {"from": "spec.ports", "to": "spec.endpoints"}],
        "added": [{"path": "spec.ports[port].port", "default": 1},
                  {"path": "spec.endpoints[].x", "default": 1},
                  {"path": "spec.items[]", "default": 1}]}]}))
    .expect("spec");
    let Err(errors) = Converter::new(&spec, &versions(&["v1", "v2"]), &[]) else {
        panic!("invalid paths accepted");
    };
    let text = errors.to_string();
    for expected in [
        "spec.conversion.changes[0].renamed[0].to: a rename stays within the same list items",
        "spec.conversion.changes[0].added[0].path: spec.ports[port].port is a key its list's items are matched by",
        "spec.conversion.changes[0].added[1].path: spec.endpoints[].x: the list spec.endpoints is renamed in this step",
        "spec.conversion.changes[0].added[2].path: \"spec.items[]\" ends at a list",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
}

/// A list a client of the older version deleted takes what its items kept with it: nothing
/// stale comes back into items added later.
#[test]
fn what_items_kept_goes_with_their_list() {
    let c = chain_of(json!({"from": "v1", "to": "v2",
        "added": [{"path": "spec.ports[].appProtocol", "default": "tcp"}]}));
    let v2 = widget("v2", json!({"ports": [{"port": 80, "appProtocol": "http"}]}));
    let mut v1 = c.convert(&v2, "v1").expect("down");
    v1["spec"] = json!({});
    let up = c.convert(&v1, "v2").expect("up");
    assert!(saved_of(&up).is_none(), "{up}");
    let mut again = up.clone();
    again["spec"] = json!({"ports": [{"port": 81}]});
    let down = c.convert(&again, "v1").expect("down");
    assert_eq!(c.convert(&down, "v2").expect("up"), again, "no stale appProtocol");
}

// ---- property tests of rules inside list items ----

/// Three versions of a list of items keyed by `k`: v1 drops `a`, renames `b` to `bb` and
/// adds `c` (default "dc"); v2 shortens `c` to three characters (a lossy type change) and
/// adds `e` to the items of each item's positional list `sub`.
fn item_chain() -> Converter {
    let spec: ConversionSpec = serde_json::from_value(json!({"changes": [
        {"from": "v0", "to": "v1",
         "removed": ["spec.items[k].a"],
         "renamed": [{"from": "spec.items[k].b", "to": "spec.items[k].bb"}],
         "added": [{"path": "spec.items[k].c", "default": "dc"}]},
        {"from": "v1", "to": "v2",
         "changed": [{"path": "spec.items[k].c", "upgrade": "self == null || string(self).size() <= 3 ? self : string(self).substring(0, 3)", "downgrade": "self"}],
         "added": [{"path": "spec.items[k].sub[].e", "default": 0}]},
    ]}))
    .expect("spec");
    Converter::new(&spec, &versions(&["v0", "v1", "v2"]), &[]).expect("valid")
}

/// The fields an item of each version may have.
const ITEM_FIELDS: [&[&str]; 3] = [&["a", "b"], &["bb", "c"], &["bb", "c"]];

fn item_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        "[a-z]{0,6}".prop_map(Value::from),
        Just(json!("dc")),
        any::<i16>().prop_map(Value::from),
        Just(json!(0)),
        Just(Value::Null),
    ]
}

/// An object of version `v` of [`item_chain`]: up to four items with distinct keys (a key
/// may be missing on one), each with some of its version's fields and a `sub` list.
fn item_object() -> impl Strategy<Value = (usize, Value)> {
    (0..3usize).prop_flat_map(|version| {
        let item = (
            proptest::option::of("[a-c]"),
            proptest::collection::vec(proptest::option::of(item_value()), 2),
            proptest::option::of(proptest::collection::vec(
                proptest::option::of(item_value()),
                0..3,
            )),
        );
        (
            Just(version),
            proptest::collection::vec(item, 0..4),
            any::<bool>(),
        )
            .prop_map(|(version, items, has_list)| {
                let mut seen = std::collections::BTreeSet::new();
                let items: Vec<Value> = items
                    .into_iter()
                    .filter(|(key, _, _)| seen.insert(key.clone()))
                    .map(|(key, values, sub)| {
                        let mut item = serde_json::Map::new();
                        if let Some(key) = key {
                            item.insert("k".into(), json!(key));
                        }
                        for (name, value) in ITEM_FIELDS[version].iter().zip(values) {
                            if let Some(value) = value {
                                item.insert((*name).into(), value);
                            }
                        }
                        if let Some(sub) = sub {
                            let sub: Vec<Value> = sub
                                .into_iter()
                                .map(|e| match (version, e) {
                                    (2, Some(e)) => json!({"n": 1, "e": e}),
                                    _ => json!({"n": 1}),
                                })
                                .collect();
                            item.insert("sub".into(), json!(sub));
                        }
                        Value::Object(item)
                    })
                    .collect();
                let spec = if has_list {
                    json!({"items": items})
                } else {
                    json!({})
                };
                (version, widget(&format!("v{version}"), spec))
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, max_global_rejects: 100_000, ..ProptestConfig::default() })]

    /// Any object converts to every other version and back exactly, whatever its items hold.
    #[test]
    fn list_items_round_trip((version, object) in item_object()) {
        let c = item_chain();
        let here = format!("v{version}");
        for there in ["v0", "v1", "v2"] {
            let converted = c.convert(&object, there).expect("converts");
            let back = c.convert(&converted, &here).expect("converts back");
            prop_assert_eq!(&back, &object, "via {}: {}", there, converted);
        }
    }

    /// In an older version, a client reorders the items and drops some: back in the newer
    /// version, every remaining item is the item it was, matched by its key.
    #[test]
    fn kept_item_fields_follow_their_key((version, object) in item_object(), order in any::<u64>(), drop in any::<usize>()) {
        prop_assume!(version > 0);
        let c = item_chain();
        let here = format!("v{version}");
        let mut older = c.convert(&object, "v0").expect("down");
        let Some(items) = older["spec"]["items"].as_array_mut() else {
            return Ok(());
        };
        prop_assume!(items.iter().all(|item| item.get("k").is_some()));
        if !items.is_empty() {
            items.remove(drop % items.len());
        }
        let len = items.len().max(1);
        items.rotate_left((order as usize) % len);
        let kept: Vec<Value> = items.iter().map(|item| item["k"].clone()).collect();
        let back = c.convert(&older, &here).expect("up");
        let original = object["spec"]["items"].as_array().expect("items");
        let returned = back["spec"]["items"].as_array().expect("items");
        prop_assert_eq!(returned.len(), kept.len());
        for (item, key) in returned.iter().zip(&kept) {
            let before = original.iter().find(|o| o["k"] == *key).expect("the same key");
            prop_assert_eq!(item, before, "{}", back);
        }
    }
}
