//! How the tests write a version's flags: `s` served, `S` storage, `d` deprecated, `-`
//! none of them (e.g. `v1alpha1:sd v1:sS`).

pub fn letters(served: bool, storage: bool, deprecated: bool) -> String {
    let flags: String = [(served, 's'), (storage, 'S'), (deprecated, 'd')]
        .into_iter()
        .filter_map(|(on, letter)| on.then_some(letter))
        .collect();
    if flags.is_empty() { "-".to_owned() } else { flags }
}
