//! The printed table: section heads and rows of figures, one cell a column, padded to the
//! widest cell of each column.

use std::fmt::Write as _;

/// The columns of the printed table.
const COLUMNS: [&str; 5] = [
    "scenario / figure",
    "redsem",
    "seeds' algorithm (S7)",
    "polling (S9)",
    "raw limit (S8)",
];

/// Rows of the printed table: section heads and figure rows, one cell per column.
#[derive(Debug, Default)]
pub(super) struct Table {
    rows: Vec<Row>,
}

#[derive(Debug)]
enum Row {
    Head(String),
    Figures([String; 5]),
}

impl Table {
    pub(super) fn head(&mut self, title: &str) {
        self.rows.push(Row::Head(title.to_owned()));
    }

    pub(super) fn row(
        &mut self,
        figure: &str,
        redsem: String,
        seeds: String,
        polling: String,
        raw: String,
    ) {
        self.rows.push(Row::Figures([
            format!("  {figure}"),
            redsem,
            seeds,
            polling,
            raw,
        ]));
    }

    /// A row of the same figure (`f`) of redsem's, the seeds' and the polling baseline's run
    /// (`runs`, in that order; a dash where one did not run), and the raw limit's cell.
    pub(super) fn compare<R>(
        &mut self,
        figure: &str,
        runs: [Option<&R>; 3],
        f: impl Fn(&R) -> String,
        raw: String,
    ) {
        let [redsem, seeds, polling] = runs.map(|run| run.map_or_else(dash, &f));
        self.row(figure, redsem, seeds, polling, raw);
    }

    /// A row with a figure for redsem only.
    pub(super) fn redsem_row(&mut self, figure: &str, redsem: String) {
        self.row(figure, redsem, dash(), dash(), dash());
    }

    pub(super) fn render(&self) -> String {
        let mut widths = COLUMNS.map(|c| c.chars().count());
        for row in &self.rows {
            if let Row::Figures(cells) = row {
                for (w, c) in widths.iter_mut().zip(cells) {
                    *w = (*w).max(c.chars().count());
                }
            }
        }
        let line = |cells: &[String]| {
            let mut s = String::new();
            for (c, w) in cells.iter().zip(widths) {
                let pad = w.saturating_sub(c.chars().count());
                let _ = write!(s, "{c}{}  ", " ".repeat(pad));
            }
            s.trim_end().to_owned()
        };
        let mut out = String::new();
        let _ = writeln!(out, "{}", line(&COLUMNS.map(str::to_owned)));
        let _ = writeln!(
            out,
            "{}",
            "-".repeat(widths.iter().sum::<usize>() + 2 * (COLUMNS.len() - 1))
        );
        for row in &self.rows {
            match row {
                Row::Head(title) => {
                    let _ = writeln!(out, "{title}");
                }
                Row::Figures(cells) => {
                    let _ = writeln!(out, "{}", line(cells));
                }
            }
        }
        out
    }
}

/// The cell of a figure not measured, or not measured by that algorithm.
pub(super) fn dash() -> String {
    "—".to_owned()
}
