//! Formats for people: short durations and aligned tables. Pure functions, used by what
//! prints ([`crate::output`]) and by the error messages ([`crate::error`]).

use std::fmt::Write as _;
use std::time::Duration;

/// A duration as a person reads it at a glance: `350ms`, `2.4s`, `3m 20s`, `2h 5m`.
pub(crate) fn duration(d: Duration) -> String {
    let ms = d.as_millis();
    let secs = d.as_secs();
    match secs {
        0 => format!("{ms}ms"),
        1..60 => format!("{:.1}s", d.as_secs_f64()),
        60..3600 => format!("{}m {}s", secs / 60, secs % 60),
        _ => format!("{}h {}m", secs / 3600, secs % 3600 / 60),
    }
}

/// Whole milliseconds, for JSON.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Columns padded to their widest cell, two spaces apart; the last column is not padded.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, (cell, width)) in row.iter().zip(&widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<width$}  ");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_at_a_glance() {
        assert_eq!(duration(Duration::from_millis(350)), "350ms");
        assert_eq!(duration(Duration::from_millis(2400)), "2.4s");
        assert_eq!(duration(Duration::from_secs(200)), "3m 20s");
        assert_eq!(duration(Duration::from_secs(7500)), "2h 5m");
    }

    #[test]
    fn tables_align_their_columns() {
        let rows = vec![
            vec!["a".to_owned(), "1".to_owned(), "x".to_owned()],
            vec!["long".to_owned(), "22".to_owned(), "y".to_owned()],
        ];
        assert_eq!(
            table(&["NAME", "N", "LAST"], &rows),
            "NAME  N   LAST\na     1   x\nlong  22  y\n"
        );
    }
}
