//! The soak's figures over its periods, drawn for `--plot`.

use std::path::Path;

use super::report::{PeriodFigures, SoakReport, WORKLOADS, WorkloadFigures};

/// The report's figures over the periods, for `--plot`: operations per second of each workload
/// against the first period, p99 latencies, and memory.
pub fn plot(report: &SoakReport, path: &Path) -> Result<(), String> {
    use crate::plot::{Panel, Series};
    let minute = |p: &PeriodFigures| f64::from(p.period) * report.period_s / 60.0;
    let per_workload = |figure: &dyn Fn(&WorkloadFigures) -> f64| -> Vec<Series> {
        WORKLOADS
            .iter()
            .enumerate()
            .map(|(w, name)| {
                let points = report
                    .periods
                    .iter()
                    .map(|p| (minute(p), figure(&p.workloads[w])))
                    .collect();
                (name.to_string(), points)
            })
            .collect()
    };
    let mut memory: Vec<Series> = vec![(
        "server".into(),
        report
            .periods
            .iter()
            .map(|p| (minute(p), p.server_rss_mib))
            .collect(),
    )];
    memory.push((
        "server, heap".into(),
        report
            .periods
            .iter()
            .map(|p| (minute(p), p.server_anon_mib))
            .collect(),
    ));
    if report
        .periods
        .iter()
        .any(|p| p.server_heap_in_use_mib > 0.0)
    {
        memory.push((
            "server, heap in use".into(),
            report
                .periods
                .iter()
                .map(|p| (minute(p), p.server_heap_in_use_mib))
                .collect(),
        ));
        memory.push((
            "server, caches".into(),
            report
                .periods
                .iter()
                .map(|p| (minute(p), p.server_cached_mib))
                .collect(),
        ));
    }
    for m in 0..report.mounts {
        memory.push((
            format!("mount {}", m + 1),
            report
                .periods
                .iter()
                .map(|p| (minute(p), p.mount_rss_mib.get(m).copied().unwrap_or(0.0)))
                .collect(),
        ));
        memory.push((
            format!("mount {}, heap", m + 1),
            report
                .periods
                .iter()
                .map(|p| (minute(p), p.mount_anon_mib.get(m).copied().unwrap_or(0.0)))
                .collect(),
        ));
    }
    let records: Vec<Series> = vec![
        (
            "at the minute's end".into(),
            report
                .periods
                .iter()
                .map(|p| (minute(p), p.records_per_chunk as f64))
                .collect(),
        ),
        (
            "most since start".into(),
            report
                .periods
                .iter()
                .map(|p| (minute(p), p.records_per_chunk_high as f64))
                .collect(),
        ),
    ];
    let panels = [
        Panel {
            y_label: "operations/s, vs the first minute".into(),
            series: per_workload(&|w| w.ratio_to_first),
            log_y: false,
        },
        Panel {
            y_label: "p99 latency, ms".into(),
            series: per_workload(&|w| w.p99_ms),
            log_y: true,
        },
        Panel {
            y_label: "records in a hot file's chunk".into(),
            series: records,
            log_y: false,
        },
        Panel {
            y_label: "resident memory, MiB".into(),
            series: memory,
            log_y: false,
        },
    ];
    crate::plot::stacked_svg(
        path,
        &format!(
            "calm soak: {} mounts of one server, {} minutes",
            report.mounts,
            report.periods.len() as f64 * report.period_s / 60.0
        ),
        "minutes",
        &panels,
    )
}
