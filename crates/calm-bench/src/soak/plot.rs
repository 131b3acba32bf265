//! The soak's figures over its periods, drawn for `--plot`.

use std::path::Path;

use super::report::{PeriodFigures, SoakReport, WORKLOADS, WorkloadFigures};
use crate::multiples::Cell;

/// The report's figures over the periods, for `--plot`, as small multiples: each workload's
/// operations per second against the first period and its p99 latency; records in a hot
/// chunk; the memory of the server and of the mounts.
pub fn plot(report: &SoakReport, path: &Path) -> Result<(), String> {
    let minute = |p: &PeriodFigures| f64::from(p.period) * report.period_s / 60.0;
    let cell = |panel: &str, y_label: &str, log_y: bool, series: &str, p, y| {
        Cell::at(panel, ("minutes", minute(p)), (y_label, y), series).log_if(log_y)
    };
    let mut cells = Vec::new();
    type Figure = fn(&WorkloadFigures) -> f64;
    let per_workload: [(&str, &str, bool, Figure); 2] = [
        ("operations per second", "vs the first minute", false, |w| {
            w.ratio_to_first
        }),
        ("p99 latency", "ms", true, |w| w.p99_ms),
    ];
    for (panel, unit, log_y, figure) in per_workload {
        for (w, name) in WORKLOADS.iter().enumerate() {
            for p in &report.periods {
                cells.push(cell(panel, unit, log_y, name, p, figure(&p.workloads[w])));
            }
        }
    }
    let heap_figures = report
        .periods
        .iter()
        .any(|p| p.server_heap_in_use_mib > 0.0);
    for p in &report.periods {
        let records = "records in a hot file's chunk";
        cells.push(cell(
            records,
            "records",
            false,
            "records at the period's end",
            p,
            p.records_per_chunk as f64,
        ));
        cells.push(cell(
            records,
            "records",
            false,
            "most records since the start",
            p,
            p.records_per_chunk_high as f64,
        ));
        let (resident, anon) = ("resident memory", "anonymous memory (heap)");
        cells.push(cell(resident, "MiB", false, "server", p, p.server_rss_mib));
        cells.push(cell(anon, "MiB", false, "server", p, p.server_anon_mib));
        cells.push(cell(
            resident,
            "MiB",
            false,
            "mounts, summed",
            p,
            p.mount_rss_mib.iter().sum(),
        ));
        cells.push(cell(
            anon,
            "MiB",
            false,
            "mounts, summed",
            p,
            p.mount_anon_mib.iter().sum(),
        ));
        if heap_figures {
            let heap = "the server's heap";
            cells.push(cell(
                heap,
                "MiB",
                false,
                "server heap in use",
                p,
                p.server_heap_in_use_mib,
            ));
            cells.push(cell(
                heap,
                "MiB",
                false,
                "server caches",
                p,
                p.server_cached_mib,
            ));
        }
    }
    crate::multiples::small_multiples_svg(
        path,
        &format!(
            "calm-bench soak: {} mounts of one server, {} minutes",
            report.mounts,
            report.periods.len() as f64 * report.period_s / 60.0
        ),
        &crate::multiples::facets_of(cells),
    )
}
