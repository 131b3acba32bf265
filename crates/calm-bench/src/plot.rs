//! SVG plots of figures over the periods of a long run (linear, stacked panels); the
//! benchmarks' small multiples are in `crate::multiples`.

use std::path::Path;

use plotters::prelude::*;

/// One named curve: (x, y) points.
pub type Series = (String, Vec<(f64, f64)>);

/// Distinct colours for up to twelve curves (then they repeat).
const COLORS: [RGBColor; 12] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(0, 0, 0),
    RGBColor(0, 0, 128),
];

/// One panel of a stacked plot: its y axis and its curves.
#[derive(Debug, Clone)]
pub struct Panel {
    pub y_label: String,
    pub series: Vec<Series>,
    /// A logarithmic y axis (for figures spread over decades, such as latencies).
    pub log_y: bool,
}

/// Draws the curves of one panel on `$chart` (its axes built), with their legend.
macro_rules! draw_panel {
    ($chart:expr, $panel:expr, $x_label:expr, $legend:expr, $err:expr) => {{
        let chart = &mut $chart;
        chart
            .configure_mesh()
            .x_desc($x_label)
            .y_desc($panel.y_label.as_str())
            .draw()
            .map_err(|e| $err(&e))?;
        for (i, (name, points)) in $panel.series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            chart
                .draw_series(LineSeries::new(
                    points.iter().copied(),
                    color.stroke_width(2),
                ))
                .map_err(|e| $err(&e))?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position($legend.position())
            .draw()
            .map_err(|e| $err(&e))?;
    }};
}

/// A corner of a panel, for its legend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Corner {
    LowerRight,
    UpperRight,
    UpperLeft,
    LowerLeft,
}

impl Corner {
    fn position(self) -> SeriesLabelPosition {
        match self {
            Corner::LowerRight => SeriesLabelPosition::LowerRight,
            Corner::UpperRight => SeriesLabelPosition::UpperRight,
            Corner::UpperLeft => SeriesLabelPosition::UpperLeft,
            Corner::LowerLeft => SeriesLabelPosition::LowerLeft,
        }
    }
}

/// Share of a panel's width, and of its height per curve, that a legend covers (about: 180
/// of 900 pixels, 22 of 230 per line).
const LEGEND_WIDTH: f64 = 0.25;
const LEGEND_HEIGHT_PER_SERIES: f64 = 0.1;

/// The corner where a legend hides the fewest points of `series`, on axes from 0 to `x_max`
/// and from `y_lo` to `y_hi` (for a logarithmic axis, give the logarithms: `y` maps each
/// point's value to the axis); on a tie, the first of lower right, upper right, upper left,
/// lower left.
pub fn legend_corner(
    series: &[Series],
    x_max: f64,
    (y_lo, y_hi): (f64, f64),
    y: impl Fn(f64) -> f64,
) -> Corner {
    let width = LEGEND_WIDTH * x_max;
    let height = (LEGEND_HEIGHT_PER_SERIES * (series.len() as f64 + 1.0)).min(1.0) * (y_hi - y_lo);
    let hidden = |corner: Corner| {
        let (right, upper) = match corner {
            Corner::LowerRight => (true, false),
            Corner::UpperRight => (true, true),
            Corner::UpperLeft => (false, true),
            Corner::LowerLeft => (false, false),
        };
        series
            .iter()
            .flat_map(|(_, points)| points.iter())
            .filter(|(px, py)| {
                let py = y(*py);
                let in_x = if right {
                    *px >= x_max - width
                } else {
                    *px <= width
                };
                let in_y = if upper {
                    py >= y_hi - height
                } else {
                    py <= y_lo + height
                };
                in_x && in_y
            })
            .count()
    };
    [
        Corner::LowerRight,
        Corner::UpperRight,
        Corner::UpperLeft,
        Corner::LowerLeft,
    ]
    .into_iter()
    .min_by_key(|corner| hidden(*corner))
    .expect("four corners")
}

/// Draws `panels` one above the other, sharing the x axis (linear, from 0), into an SVG file
/// at `path`; a panel's y axis is linear from 0, or logarithmic.
pub fn stacked_svg(
    path: &Path,
    title: &str,
    x_label: &str,
    panels: &[Panel],
) -> Result<(), String> {
    let x_max = panels
        .iter()
        .flat_map(|p| p.series.iter().flat_map(|(_, points)| points.iter()))
        .map(|(x, _)| *x)
        .fold(f64::MIN, f64::max);
    if panels.is_empty() || x_max == f64::MIN {
        return Err("nothing to plot".into());
    }
    let height = 60 + 300 * panels.len() as u32;
    let root = SVGBackend::new(path, (1000, height)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| format!("plotting {}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let root = root
        .titled(title, ("sans-serif", 22))
        .map_err(|e| err(&e))?;
    for (panel, area) in panels.iter().zip(root.split_evenly((panels.len(), 1))) {
        let ys = || {
            panel
                .series
                .iter()
                .flat_map(|(_, points)| points.iter().map(|(_, y)| *y))
        };
        let y_max = ys().fold(0.0, f64::max).max(1e-9);
        let mut builder = ChartBuilder::on(&area);
        builder
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70);
        if panel.log_y {
            let y_min = ys().filter(|y| *y > 0.0).fold(y_max, f64::min);
            let (y_lo, y_hi) = (y_min * 0.5, y_max * 2.0);
            let legend = legend_corner(
                &panel.series,
                x_max * 1.02,
                (y_lo.log10(), y_hi.log10()),
                |y| y.max(y_lo).log10(),
            );
            let mut chart = builder
                .build_cartesian_2d(0.0..x_max * 1.02, (y_lo..y_hi).log_scale())
                .map_err(|e| err(&e))?;
            draw_panel!(chart, panel, x_label, legend, err);
        } else {
            let legend = legend_corner(&panel.series, x_max * 1.02, (0.0, y_max * 1.25), |y| y);
            let mut chart = builder
                .build_cartesian_2d(0.0..x_max * 1.02, 0.0..y_max * 1.25)
                .map_err(|e| err(&e))?;
            draw_panel!(chart, panel, x_label, legend, err);
        }
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flat(name: &str, y: f64) -> Series {
        (name.into(), (0..=30).map(|m| (f64::from(m), y)).collect())
    }

    #[test]
    fn the_legend_goes_where_the_curves_are_not() {
        // Curves low on the panel: the legend goes up, right first.
        let low = vec![flat("a", 5.0), flat("b", 8.0), flat("c", 10.0)];
        assert_eq!(
            legend_corner(&low, 30.6, (0.0, 125.0), |y| y),
            Corner::UpperRight
        );
        // Curves high: it stays low.
        let high = vec![flat("a", 100.0), flat("b", 90.0)];
        assert_eq!(
            legend_corner(&high, 30.6, (0.0, 125.0), |y| y),
            Corner::LowerRight
        );
        // One curve falls from the upper left to the lower right, another runs along the
        // top: only the lower left is free.
        let mut crossing: Vec<Series> = vec![(
            "a".into(),
            (0..=30)
                .map(|m| (f64::from(m), 100.0 - 3.0 * f64::from(m)))
                .collect(),
        )];
        crossing.push(flat("b", 110.0));
        assert_eq!(
            legend_corner(&crossing, 30.6, (0.0, 125.0), |y| y),
            Corner::LowerLeft
        );
    }
}
