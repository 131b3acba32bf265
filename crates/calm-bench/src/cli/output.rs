//! What every benchmark prints and draws besides its table: the `--json` and `--plot` flags,
//! and the [`Output`] the binary prints.

use std::path::{Path, PathBuf};

use crate::multiples::Facet;

/// What a benchmark has to print: its table, and its report as one line of JSON when
/// `--json` asked for it (the table then goes to stderr).
#[derive(Debug, Default)]
pub struct Output {
    pub table: Vec<String>,
    pub json: Option<String>,
}

/// What every benchmark prints and draws besides its table.
#[derive(Debug, clap::Args)]
pub struct OutputArgs {
    /// Print the report as one line of JSON (the table then goes to stderr).
    #[arg(long)]
    pub json: bool,
    /// Draw the figures into this SVG file: one panel per case, each in one unit, calm beside
    /// its baselines.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
}

impl OutputArgs {
    /// Draws the plot when `--plot` asks for one (`draw` writes it to the path), then gives
    /// the table, with `report` as JSON when `--json` asks for it.
    pub fn finish(
        &self,
        table: Vec<String>,
        report: &impl serde::Serialize,
        draw: impl FnOnce(&Path) -> Result<(), String>,
    ) -> Result<Output, String> {
        if let Some(path) = &self.plot {
            draw(path)?;
        }
        Ok(Output {
            table,
            json: self
                .json
                .then(|| serde_json::to_string(report))
                .transpose()
                .map_err(|e| format!("writing the report: {e}"))?,
        })
    }
}

/// A `draw` for [`OutputArgs::finish`]: the panels `facets` makes, under `title`.
pub(super) fn panels<'a>(
    title: &'a str,
    facets: impl FnOnce() -> Vec<Facet> + 'a,
) -> impl FnOnce(&Path) -> Result<(), String> + 'a {
    move |path| crate::multiples::small_multiples_svg(path, title, &facets())
}

/// The calm executable that runs servers and mounts: `calm` when given, else the `calm` beside
/// this program (cargo builds both into one directory).
pub(super) fn calm_exe(calm: Option<PathBuf>) -> Result<PathBuf, String> {
    if let Some(calm) = calm {
        return Ok(calm);
    }
    let this = std::env::current_exe().map_err(|e| format!("finding this program: {e}"))?;
    let beside = this.with_file_name("calm");
    match beside.is_file() {
        true => Ok(beside),
        false => Err(format!(
            "no calm binary beside {} (cargo build --release -p calm builds it there)",
            this.display()
        )),
    }
}
