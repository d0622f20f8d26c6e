//! The catalogue: every mutant of the Lua sources, made from the text alone (no Lua parser),
//! in a fixed order with stable ids `<file>.lua:<line>:<operator>` (`#2`, `#3`... when one
//! line has the same operator more than once).
//!
//! Operators (see docs/MUTANTS.md):
//! * `lt->le`, `le->lt`, `gt->ge`, `ge->gt`, `eq->ne`, `ne->eq`: a comparison flipped;
//! * `+N->+M`, `-N->-M`: an integer added or subtracted, off by one either way;
//! * `now-5`, `now+5`: `S.now` (the script's Redis time in ms) read 5 ms early or late;
//! * `and->or`, `or->and`;
//! * `if->true`, `if->false`: the condition of a one-line `if`/`elseif ... then` replaced;
//! * `drop`: a statement that is a bare call (a write, `put`, a helper) removed;
//! * `swap`: two adjacent such statements swapped;
//! * `return`: `do return end` as the first statement of a function.
//!
//! Comments and strings are never mutated.

use std::fmt::Write as _;

/// One mutant: a changed copy of one file.
#[derive(Debug, Clone)]
pub struct Mutant {
    pub id: String,
    /// The file's path under `lua/` without `.lua`: `lease/grants` for `lua/lease/grants.lua`.
    pub file: String,
    pub line: usize,
    pub operator: String,
    /// The whole mutated text of the file.
    pub text: String,
}

/// A source file of `lua/`.
#[derive(Debug, Clone)]
pub struct Source {
    pub stem: String,
    pub text: String,
}

/// Every mutant of `sources`, file by file, line by line.
pub fn catalogue(sources: &[Source]) -> Vec<Mutant> {
    let mut all = Vec::new();
    for source in sources {
        all.extend(mutants_of(source));
    }
    all
}

/// One edit of one line: bytes `start..end` of the line replaced by `with`.
struct Edit {
    line: usize,
    operator: String,
    start: usize,
    end: usize,
    with: String,
}

fn mutants_of(source: &Source) -> Vec<Mutant> {
    let code = code_mask(&source.text);
    let lines: Vec<(usize, &str)> = line_starts(&source.text);
    let mut edits = Vec::new();
    for (n, &(offset, line)) in lines.iter().enumerate() {
        let mask = &code[offset..offset + line.len()];
        edits.extend(line_edits(n + 1, line, mask));
    }
    let mut out = Vec::new();
    let mut push = |line: usize, operator: &str, text: String| {
        out.push(Mutant {
            id: String::new(),
            file: source.stem.clone(),
            line,
            operator: operator.to_owned(),
            text,
        });
    };
    for edit in edits {
        let (offset, line) = lines[edit.line - 1];
        let mut text = String::with_capacity(source.text.len() + edit.with.len());
        text.push_str(&source.text[..offset + edit.start]);
        text.push_str(&edit.with);
        text.push_str(&source.text[offset + edit.end..]);
        debug_assert!(edit.end <= line.len());
        push(edit.line, &edit.operator, text);
    }
    // Whole statements: dropped, swapped with the next, an early return.
    let calls: Vec<bool> = lines
        .iter()
        .map(|&(offset, line)| is_call_statement(line, &code[offset..offset + line.len()]))
        .collect();
    for (i, &(offset, line)) in lines.iter().enumerate() {
        if calls[i] {
            let indent = indent_of(line);
            let mut text = source.text.clone();
            text.replace_range(offset + indent..offset + line.len(), "");
            push(i + 1, "drop", text);
            if let Some(&(next_offset, next)) = lines.get(i + 1)
                && calls[i + 1]
                && indent_of(next) == indent
            {
                let mut text = String::with_capacity(source.text.len());
                text.push_str(&source.text[..offset]);
                text.push_str(next);
                text.push('\n');
                text.push_str(line);
                text.push_str(&source.text[next_offset + next.len()..]);
                push(i + 1, "swap", text);
            }
        }
        let mask = &code[offset..offset + line.len()];
        if opens_function(line, mask)
            && let Some(&(next_offset, next)) = lines.get(i + 1)
        {
            let at = next_offset + indent_of(next);
            let mut text = source.text.clone();
            text.insert_str(at, "do return end ");
            push(i + 1, "return", text);
        }
    }
    out.sort_by_key(|m| m.line);
    name(&source.stem, &mut out);
    out
}

/// Give each mutant its id, numbering repeats of one operator on one line.
fn name(stem: &str, mutants: &mut [Mutant]) {
    let mut seen: Vec<(usize, String)> = Vec::new();
    for m in mutants.iter_mut() {
        let key = (m.line, m.operator.clone());
        let n = seen.iter().filter(|k| **k == key).count() + 1;
        seen.push(key);
        let mut id = format!("{stem}.lua:{}:{}", m.line, m.operator);
        if n > 1 {
            let _ = write!(id, "#{n}");
        }
        m.id = id;
    }
}

/// `(byte offset, text without the newline)` of every line.
fn line_starts(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut offset = 0;
    for line in text.split('\n') {
        out.push((offset, line));
        offset += line.len() + 1;
    }
    if text.ends_with('\n') {
        out.pop();
    }
    out
}

fn indent_of(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// For each byte of `text`: true if it is code, false inside a comment or a string.
fn code_mask(text: &str) -> Vec<bool> {
    let b = text.as_bytes();
    let mut mask = vec![true; b.len()];
    let mut i = 0;
    while i < b.len() {
        let start = i;
        if b[i] == b'-' && b.get(i + 1) == Some(&b'-') {
            // A comment: `--[[ ... ]]` (or `--[==[`) or to the end of the line.
            i = match long_bracket(b, i + 2) {
                Some(level) => close_long(b, i + 2, level),
                None => b[i..]
                    .iter()
                    .position(|&c| c == b'\n')
                    .map_or(b.len(), |p| i + p),
            };
        } else if b[i] == b'\'' || b[i] == b'"' {
            let quote = b[i];
            i += 1;
            while i < b.len() && b[i] != quote && b[i] != b'\n' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i = (i + 1).min(b.len());
        } else if let Some(level) = long_bracket(b, i) {
            i = close_long(b, i, level);
        } else {
            i += 1;
            continue;
        }
        for m in &mut mask[start..i] {
            *m = false;
        }
    }
    mask
}

/// The level of a long bracket `[[` / `[=[`... opening at `i`.
fn long_bracket(b: &[u8], i: usize) -> Option<usize> {
    if b.get(i) != Some(&b'[') {
        return None;
    }
    let mut j = i + 1;
    while b.get(j) == Some(&b'=') {
        j += 1;
    }
    (b.get(j) == Some(&b'[')).then_some(j - i - 1)
}

/// The end (exclusive) of the long bracket of `level` opened at `i`.
fn close_long(b: &[u8], i: usize, level: usize) -> usize {
    let close: Vec<u8> = std::iter::once(b']')
        .chain(std::iter::repeat_n(b'=', level))
        .chain(std::iter::once(b']'))
        .collect();
    let from = i + level + 2;
    b[from.min(b.len())..]
        .windows(close.len())
        .position(|w| w == close.as_slice())
        .map_or(b.len(), |p| from + p + close.len())
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The edits inside one line (operators that change a token or an expression).
fn line_edits(n: usize, line: &str, code: &[bool]) -> Vec<Edit> {
    let b = line.as_bytes();
    let mut edits = Vec::new();
    let mut edit = |operator: &str, start: usize, end: usize, with: &str| {
        edits.push(Edit {
            line: n,
            operator: operator.to_owned(),
            start,
            end,
            with: with.to_owned(),
        });
    };
    let mut i = 0;
    while i < b.len() {
        if !code[i] {
            i += 1;
            continue;
        }
        let two = b.get(i..i + 2).unwrap_or(&[]);
        let prev_ident = i > 0 && (is_ident(b[i - 1]) || b[i - 1] == b'.');
        match two {
            b"<=" => edit("le->lt", i, i + 2, "<"),
            b">=" => edit("ge->gt", i, i + 2, ">"),
            b"==" => edit("eq->ne", i, i + 2, "~="),
            b"~=" => edit("ne->eq", i, i + 2, "=="),
            _ => {}
        }
        if two.len() == 2 && matches!(two, b"<=" | b">=" | b"==" | b"~=") {
            i += 2;
            continue;
        }
        match b[i] {
            b'<' => edit("lt->le", i, i + 1, "<="),
            b'>' => edit("gt->ge", i, i + 1, ">="),
            b'+' | b'-' if is_binary(b, i) => {
                if let Some((start, end, value)) = integer_after(b, i + 1) {
                    let op = b[i] as char;
                    for other in [value.wrapping_sub(1), value + 1] {
                        if value == 0 && other == u64::MAX {
                            continue;
                        }
                        edit(
                            &format!("{op}{value}->{op}{other}"),
                            start,
                            end,
                            &other.to_string(),
                        );
                    }
                }
            }
            c if is_ident(c) && !prev_ident => {
                let end = b[i..]
                    .iter()
                    .position(|&c| !is_ident(c))
                    .map_or(b.len(), |p| i + p);
                let word = &line[i..end];
                match word {
                    "and" => edit("and->or", i, end, "or"),
                    "or" => edit("or->and", i, end, "and"),
                    "S" if line[end..].starts_with(".now")
                        && !b.get(end + 4).is_some_and(|&c| is_ident(c)) =>
                    {
                        edit("now-5", i, end + 4, "(S.now - 5)");
                        edit("now+5", i, end + 4, "(S.now + 5)");
                    }
                    "if" | "elseif" => {
                        if let Some(then) = condition_end(line, code, end) {
                            edit("if->true", end, then, " true ");
                            edit("if->false", end, then, " false ");
                        }
                    }
                    _ => {}
                }
                i = end;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    edits
}

/// Whether the `+`/`-` at `i` is a binary operator (after an operand, before a space).
fn is_binary(b: &[u8], i: usize) -> bool {
    let before = b[..i].iter().rev().find(|c| **c != b' ');
    let after = b.get(i + 1);
    matches!(before, Some(c) if is_ident(*c) || *c == b')' || *c == b']')
        && after == Some(&b' ')
        && b.get(i + 1..i + 3) != Some(b"--")
}

/// An integer literal after spaces from `i`: `(start, end, value)`, if it stands alone (not
/// `1.5`, `1e3`, `0x10`, nor the start of a product `2 * x`).
fn integer_after(b: &[u8], i: usize) -> Option<(usize, usize, u64)> {
    let start = i + b[i..].iter().position(|c| *c != b' ')?;
    let len = b[start..].iter().position(|c| !c.is_ascii_digit());
    let end = len.map_or(b.len(), |l| start + l);
    if end == start || b.get(end).is_some_and(|c| is_ident(*c) || *c == b'.') {
        return None;
    }
    let rest = b[end..].iter().find(|c| **c != b' ');
    if matches!(rest, Some(b'*' | b'/' | b'%' | b'^')) {
        return None;
    }
    let value = std::str::from_utf8(&b[start..end]).ok()?.parse().ok()?;
    Some((start, end, value))
}

/// Where the condition of an `if`/`elseif` that ends on this line with `then` ends: the
/// byte offset of that `then`.
fn condition_end(line: &str, code: &[bool], from: usize) -> Option<usize> {
    let trimmed = line.trim_end();
    let then = trimmed.len().checked_sub(4)?;
    (trimmed.ends_with("then") && then > from && code[then] && line.as_bytes()[then - 1] == b' ')
        .then_some(then)
}

/// A line that is one whole call statement: `name(...)`, `a.b(...)`, `redis.call(...)`,
/// with its parentheses closed on the line and nothing after them but a comment.
fn is_call_statement(line: &str, code: &[bool]) -> bool {
    let indent = indent_of(line);
    let b = line.as_bytes();
    let code_end = (indent..b.len())
        .rev()
        .find(|&i| code[i] && b[i] != b' ')
        .map_or(indent, |i| i + 1);
    let statement = &line[indent..code_end];
    let head = statement
        .bytes()
        .position(|c| !(is_ident(c) || c == b'.'))
        .unwrap_or(statement.len());
    let name = &statement[..head];
    if name.is_empty()
        || !statement[head..].starts_with('(')
        || !statement.ends_with(')')
        || matches!(
            name,
            "if" | "elseif" | "while" | "return" | "local" | "until" | "not" | "and" | "or"
        )
    {
        return false;
    }
    // The first `(` closes at the end, and no `=` at depth 0 (not an assignment).
    let mut depth = 0_i32;
    for (i, c) in statement.bytes().enumerate().skip(head) {
        if !code[indent + i] {
            continue;
        }
        match c {
            b'(' | b'{' | b'[' => depth += 1,
            b')' | b'}' | b']' => {
                depth -= 1;
                if depth == 0 && i + 1 != statement.len() {
                    return false;
                }
            }
            _ => {}
        }
    }
    depth == 0
}

/// A line that ends by opening a function body: `... function name(args)` or
/// `... function(args)`.
fn opens_function(line: &str, code: &[bool]) -> bool {
    let trimmed = line.trim_end();
    let Some(at) = trimmed.find("function") else {
        return false;
    };
    code[at]
        && trimmed.ends_with(')')
        && !trimmed[at..].contains(" end")
        && trimmed[at..].matches('(').count() == 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(text: &str) -> Vec<String> {
        catalogue(&[Source {
            stem: "x".into(),
            text: text.into(),
        }])
        .into_iter()
        .map(|m| m.id)
        .collect()
    }

    #[test]
    fn comments_and_strings_are_not_mutated() {
        assert!(ids("-- a < b and c\nlocal s = 'x == y' -- if a then\n").is_empty());
    }
}
