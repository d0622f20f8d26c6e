//! The library's module layers (`docs/DESIGN.md`, Module layers), checked: a module names
//! only modules of the layers under its own, so no two modules import each other, even
//! through others.
//!
//! The test reads the sources as text. A module's names are the `crate::<module>` paths in
//! its files (also inside `crate::{...}` groups), outside comments and outside test code
//! (files named `tests.rs` or `test_support.rs`, files in a `tests` folder, and a trailing
//! `#[cfg(test)] mod tests`).
//! Paths to the crate root's re-exports (`crate::Redsem`) name the public API, not a module.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The modules, bottom first. A module may name the modules of the layers before its own,
/// never one of its own layer or above. A new module gets a place here.
const LAYERS: &[&[&str]] = &[
    &["error", "clock", "keys"],
    &["types", "observe", "url", "retry"],
    // The client session: the sequence numbers of retry-safe calls.
    &["session"],
    // Which engine serves the calls (redsem's module or the Lua scripts), and what a
    // connection remembers of it.
    &["engine"],
    // The Lua scripts, their wrappers and the replica acknowledgements.
    &["script"],
    // The command connection; the keepalive driver (held by the client, it schedules any
    // `Renewable`).
    &["conn", "keepalive"],
    // Pub/sub and the wake-up message format.
    &["notify"],
    // `Redsem`: connections, options, server checks, notifier, background clean-up.
    &["client"],
    // The waiting engine; group commit.
    &["wait", "batch"],
    &["lease", "permits"],
    &["mutex", "latch"],
    // Every `Redsem::<primitive>` factory method; the status report of a name (all three
    // primitives read at once).
    &["factory", "report"],
    // The blocking facade and the tower layer, over the public API.
    &["blocking", "tower"],
];

/// Where `module` sits in [`LAYERS`].
fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

/// The modules that `code` names by `crate::` paths, comments stripped.
fn named_modules(code: &str, found: &mut BTreeSet<String>) {
    let marker = format!("{}::", "crate");
    for line in code.lines() {
        let line = line.split("//").next().unwrap_or_default();
        for (at, _) in line.match_indices(&marker) {
            let rest = &line[at + marker.len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let group = group.split('}').next().unwrap_or_default();
                for item in group.split(',') {
                    found.extend(module_word(item.trim()));
                }
            } else {
                found.extend(module_word(rest));
            }
        }
    }
}

/// The module a path starts with (`notify::wake::split` gives `notify`); `None` for a name
/// of the crate root (capitalised: a type, a constant) or nothing.
fn module_word(path: &str) -> Option<String> {
    let word: String = path
        .chars()
        .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
        .collect();
    let next = path[word.len()..].chars().next();
    (!word.is_empty() && next != Some('!') && !path[word.len()..].starts_with('(')).then_some(word)
}

/// The code of a source file that counts (`path` is under `src`): `None` for a test file, the
/// text before a trailing test module otherwise.
fn library_code(path: &Path, text: &str) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    let in_tests = path
        .parent()
        .is_some_and(|dir| dir.iter().any(|part| part == "tests"));
    if in_tests || name == "tests.rs" || name == "test_support.rs" {
        return None;
    }
    let mut code = text;
    for (at, _) in text.match_indices("#[cfg(test)]") {
        if text[at + "#[cfg(test)]".len()..]
            .trim_start()
            .starts_with("mod tests")
        {
            code = &text[..at];
            break;
        }
    }
    Some(code.to_owned())
}

/// Every top-level module of `src` and the modules its library code names.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut graph = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path.strip_prefix(src).expect("under src");
            let first = relative.iter().next().expect("a file name");
            let module = first.to_string_lossy().trim_end_matches(".rs").to_owned();
            // The crate root (re-exports), and this test.
            if module == "lib" || module == "layers" {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read source");
            let names: &mut BTreeSet<String> = graph.entry(module.clone()).or_default();
            if let Some(code) = library_code(relative, &text) {
                named_modules(&code, names);
            }
            names.remove(&module);
        }
    }
    graph
}

#[test]
fn every_module_names_only_modules_of_lower_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = graph(&src);
    let mut faults = Vec::new();
    for (module, names) in &graph {
        let Some(own) = layer_of(module) else {
            faults.push(format!("{module} has no place in LAYERS"));
            continue;
        };
        for name in names {
            match layer_of(name) {
                Some(layer) if layer < own => {}
                Some(_) => faults.push(format!(
                    "{module} (layer {own}) names {name}, which is not under it"
                )),
                None => faults.push(format!(
                    "{module} names {name}, which has no place in LAYERS"
                )),
            }
        }
    }
    for module in LAYERS.iter().flat_map(|layer| layer.iter()) {
        if !graph.contains_key(*module) {
            faults.push(format!("LAYERS lists {module}, which src/ does not have"));
        }
    }
    assert!(faults.is_empty(), "{faults:#?}\ngraph: {graph:#?}");
}

#[test]
fn paths_are_read_as_the_modules_they_start_with() {
    let mut found = BTreeSet::new();
    let code = format!(
        "use {c}::error::Result;\nlet x = {c}::notify::wake::split(p); // {c}::hidden\n\
         use {c}::{{client::Redsem, types}};\nuse {c}::Redsem;\n",
        c = "crate"
    );
    named_modules(&code, &mut found);
    let found: Vec<&str> = found.iter().map(String::as_str).collect();
    assert_eq!(found, ["client", "error", "notify", "types"]);
}
