//! Small multiples: one panel per case of a benchmark, each with one unit, the same series
//! (calm, its baselines, its peers) in the same colour in every panel, and one legend above all
//! panels, outside every curve. The x axis of a panel is its cases' values (threads, clients,
//! servers, N) evenly spaced and labelled with the values; the y axis is linear from 0, or
//! logarithmic for figures spread over decades.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

/// One named curve: (x, y) points.
pub type Series = (String, Vec<(f64, f64)>);

/// One panel: what it shows, in one unit.
#[derive(Debug, Clone)]
pub struct Facet {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
    pub log_y: bool,
}

/// Colours for up to ten series; series are told apart by colour and by marker shape.
const COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(23, 190, 207),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(0, 0, 0),
];

/// Most series one plot tells apart.
pub const SERIES_MAX: usize = COLORS.len();

/// Most values labelled on a panel's x axis (a long run's minutes are labelled every few).
const X_LABELS_MAX: usize = 10;
const PANEL_WIDTH: u32 = 440;
const PANEL_HEIGHT: u32 = 300;
const COLUMNS_MAX: usize = 3;
const TITLE_HEIGHT: u32 = 44;
const LEGEND_ROW_HEIGHT: u32 = 26;
const LEGEND_GAP: u32 = 28;

/// The names of every series of `facets`: calm's first, then the others, each in order of
/// first appearance. Their places are their colours and markers.
fn names(facets: &[Facet]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for facet in facets {
        for (name, _) in &facet.series {
            if !out.contains(name) {
                out.push(name.clone());
            }
        }
    }
    out.sort_by_key(|name| !name.starts_with("calm"));
    out
}

/// A case's value as an x-axis label: whole thousands and millions as k and M (1k, 25k,
/// 1M), others in full with three significant digits at most.
fn label(value: f64) -> String {
    match value.abs() {
        v if v >= 1e6 && (value / 1e6).fract() == 0.0 => format!("{}M", value / 1e6),
        v if v >= 1e3 && (value / 1e3).fract() == 0.0 => format!("{}k", value / 1e3),
        _ => significant(value),
    }
}

/// A y-axis label on an axis that goes up to `top`: every label of the axis in the same unit,
/// k past ten thousand and M past ten million (0, 500, 1000, 1500, not 0, 500, 1k, 1500).
fn y_label(value: f64, top: f64) -> String {
    match top.abs() {
        _ if value == 0.0 => "0".into(),
        t if t >= 1e7 => format!("{}M", significant(value / 1e6)),
        t if t >= 1e4 => format!("{}k", significant(value / 1e3)),
        _ => significant(value),
    }
}

/// `value` with three significant digits at most, whole numbers in full (an axis step of 0.2
/// sums to 0.6000000000000001).
fn significant(value: f64) -> String {
    if value.fract() == 0.0 {
        return format!("{value:.0}");
    }
    let decimals = (2 - value.abs().log10().floor() as i32).clamp(0, 9) as usize;
    let digits = format!("{value:.decimals$}");
    digits
        .trim_end_matches('0')
        .trim_end_matches('.')
        .to_string()
}

/// Draws `facets` as a grid of panels under `title` and one legend, into an SVG at `path`.
pub fn small_multiples_svg(path: &Path, title: &str, facets: &[Facet]) -> Result<(), String> {
    let names = names(facets);
    if facets.is_empty() || names.is_empty() {
        return Err("nothing to plot".into());
    }
    if names.len() > SERIES_MAX {
        return Err(format!(
            "{} series in one plot: at most {SERIES_MAX} can be told apart",
            names.len()
        ));
    }
    let columns = facets.len().min(COLUMNS_MAX);
    let rows = facets.len().div_ceil(columns);
    let width = PANEL_WIDTH * columns as u32;
    // Each entry as wide as its name (about 8 pixels a character at 15 points), wrapped.
    let mut places = Vec::with_capacity(names.len());
    let (mut x, mut row) = (16u32, 0u32);
    for name in &names {
        let entry = 34 + 8 * name.chars().count() as u32 + LEGEND_GAP;
        if x > 16 && x + entry > width {
            (x, row) = (16, row + 1);
        }
        places.push((x as i32, 8 + (row * LEGEND_ROW_HEIGHT) as i32));
        x += entry;
    }
    let legend_height = LEGEND_ROW_HEIGHT * (row + 1) + 10;
    let height = TITLE_HEIGHT + legend_height + PANEL_HEIGHT * rows as u32;
    let err = |e: &dyn std::fmt::Display| format!("plotting {}: {e}", path.display());
    let root = SVGBackend::new(path, (width, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let (top, panels) = root.split_vertically(TITLE_HEIGHT + legend_height);
    let (title_area, legend_area) = top.split_vertically(TITLE_HEIGHT);
    title_area
        .draw_text(
            title,
            &("sans-serif", 22).into_text_style(&title_area),
            (12, 12),
        )
        .map_err(|e| err(&e))?;
    for (i, (name, (x, y))) in names.iter().zip(places).enumerate() {
        let color = COLORS[i];
        legend_area
            .draw(&PathElement::new(
                vec![(x, y + 8), (x + 26, y + 8)],
                color.stroke_width(3),
            ))
            .map_err(|e| err(&e))?;
        let (at, style) = ((x + 13, y + 8), color.filled());
        match i % 3 {
            0 => legend_area.draw(&Circle::new(at, 4, style)),
            1 => legend_area.draw(&Rectangle::new(
                [(at.0 - 4, at.1 - 4), (at.0 + 4, at.1 + 4)],
                style,
            )),
            _ => legend_area.draw(&TriangleMarker::new(at, 5, style)),
        }
        .map_err(|e| err(&e))?;
        legend_area
            .draw_text(
                name,
                &("sans-serif", 15).into_text_style(&legend_area),
                (x + 34, y),
            )
            .map_err(|e| err(&e))?;
    }
    for (facet, area) in facets.iter().zip(panels.split_evenly((rows, columns))) {
        draw_facet(&area, facet, &names).map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

fn draw_facet(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    facet: &Facet,
    names: &[String],
) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let mut xs: Vec<f64> = facet
        .series
        .iter()
        .flat_map(|(_, points)| points.iter().map(|(x, _)| *x))
        .collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    let index = |x: f64| xs.iter().position(|v| *v == x).unwrap_or(0) as f64;
    let ys = || {
        facet
            .series
            .iter()
            .flat_map(|(_, points)| points.iter().map(|(_, y)| *y))
    };
    let y_max = ys().fold(0.0, f64::max).max(1e-9);
    let x_range = -0.4..(xs.len() as f64 - 0.6).max(0.4);
    let labels = xs.clone();
    let x_format = move |x: &f64| {
        let i = x.round();
        match ((x - i).abs() < 1e-6, labels.get(i as usize)) {
            (true, Some(value)) if i >= 0.0 => label(*value),
            _ => String::new(),
        }
    };
    let mut builder = ChartBuilder::on(area);
    builder
        .caption(&facet.title, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(36)
        .y_label_area_size(62);
    macro_rules! curves {
        ($chart:expr) => {{
            let chart = &mut $chart;
            chart
                .configure_mesh()
                .x_labels(xs.len().clamp(2, X_LABELS_MAX))
                .y_labels(6)
                .x_label_formatter(&x_format)
                .y_label_formatter(&|y: &f64| match facet.log_y {
                    // Decades: each label in its own unit (1, 10, 100, 1k).
                    true => label(*y),
                    false => y_label(*y, y_max),
                })
                .x_desc(facet.x_label.as_str())
                .y_desc(facet.y_label.as_str())
                .light_line_style(WHITE)
                .draw()
                .map_err(|e| err(&e))?;
            for (name, points) in &facet.series {
                let i = names.iter().position(|n| n == name).unwrap_or(0);
                let color = COLORS[i];
                let mut points: Vec<(f64, f64)> =
                    points.iter().map(|(x, y)| (index(*x), *y)).collect();
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                chart
                    .draw_series(LineSeries::new(
                        points.iter().copied(),
                        color.stroke_width(2),
                    ))
                    .map_err(|e| err(&e))?;
                let style = color.filled();
                match i % 3 {
                    0 => chart.draw_series(points.iter().map(|p| Circle::new(*p, 4, style))),
                    1 => {
                        chart.draw_series(points.iter().map(|p| {
                            EmptyElement::at(*p) + Rectangle::new([(-4, -4), (4, 4)], style)
                        }))
                    }
                    _ => {
                        chart.draw_series(points.iter().map(|p| TriangleMarker::new(*p, 5, style)))
                    }
                }
                .map_err(|e| err(&e))?;
            }
        }};
    }
    if facet.log_y {
        let y_min = ys().filter(|y| *y > 0.0).fold(y_max, f64::min);
        let mut chart = builder
            .build_cartesian_2d(x_range, (y_min * 0.5..y_max * 2.0).log_scale())
            .map_err(|e| err(&e))?;
        curves!(chart);
    } else {
        let mut chart = builder
            .build_cartesian_2d(x_range, 0.0..y_max * 1.15)
            .map_err(|e| err(&e))?;
        curves!(chart);
    }
    Ok(())
}

/// One figure of a benchmark's report, placed: its panel (and that panel's axes), its series,
/// and its point.
#[derive(Debug, Clone)]
pub struct Cell {
    pub panel: String,
    pub x_label: String,
    pub y_label: String,
    pub log_y: bool,
    pub series: String,
    pub x: f64,
    pub y: f64,
}

impl Cell {
    /// The point (x, y) of `series` in `panel`, whose axes say what x and y are
    /// (`(label, value)`), on a linear y axis.
    pub fn at(
        panel: impl Into<String>,
        (x_label, x): (impl Into<String>, f64),
        (y_label, y): (impl Into<String>, f64),
        series: impl Into<String>,
    ) -> Cell {
        Cell {
            panel: panel.into(),
            x_label: x_label.into(),
            y_label: y_label.into(),
            log_y: false,
            series: series.into(),
            x,
            y,
        }
    }

    /// The same point on a logarithmic y axis (for figures spread over decades).
    pub fn log(self) -> Cell {
        self.log_if(true)
    }

    /// The same point, on a logarithmic y axis when `log`.
    pub fn log_if(self, log: bool) -> Cell {
        Cell { log_y: log, ..self }
    }
}

/// The panels of `cells`, in the order their first cell comes, each with its series in the
/// order they come.
pub fn facets_of(cells: impl IntoIterator<Item = Cell>) -> Vec<Facet> {
    let mut facets: Vec<Facet> = Vec::new();
    for cell in cells {
        let facet = match facets.iter().position(|f| f.title == cell.panel) {
            Some(i) => &mut facets[i],
            None => {
                facets.push(Facet {
                    title: cell.panel.clone(),
                    x_label: cell.x_label.clone(),
                    y_label: cell.y_label.clone(),
                    series: Vec::new(),
                    log_y: cell.log_y,
                });
                facets.last_mut().expect("pushed")
            }
        };
        match facet
            .series
            .iter_mut()
            .find(|(name, _)| *name == cell.series)
        {
            Some((_, points)) => points.push((cell.x, cell.y)),
            None => facet.series.push((cell.series, vec![(cell.x, cell.y)])),
        }
    }
    facets
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_labels_keep_three_significant_digits() {
        assert_eq!(label(0.6000000000000001), "0.6");
        assert_eq!(label(0.000_412_3), "0.000412");
        assert_eq!(label(12.5), "12.5");
        assert_eq!(label(20_000.0), "20k");
        assert_eq!(label(3.0), "3");
        assert_eq!(y_label(2000.0, 2500.0), "2000");
        assert_eq!(y_label(1500.0, 2500.0), "1500");
        assert_eq!(y_label(12_500.0, 20_000.0), "12.5k");
        assert_eq!(y_label(0.0, 20_000.0), "0");
        assert_eq!(y_label(3_000_000.0, 40_000_000.0), "3M");
    }

    #[test]
    fn labels_read_as_a_person_writes_them() {
        assert_eq!(label(16.0), "16");
        assert_eq!(label(1000.0), "1k");
        assert_eq!(label(1500.0), "1500");
        assert_eq!(label(25_000.0), "25k");
        assert_eq!(label(1_000_000.0), "1M");
        assert_eq!(label(0.5), "0.5");
    }

    #[test]
    fn every_series_keeps_one_colour_across_panels_and_too_many_are_refused() {
        let facet = |series: &[&str]| Facet {
            title: "t".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            series: series
                .iter()
                .map(|n| (n.to_string(), vec![(1.0, 1.0)]))
                .collect(),
            log_y: false,
        };
        assert_eq!(
            names(&[facet(&["calm", "ext4"]), facet(&["tmpfs", "calm"])]),
            ["calm", "ext4", "tmpfs"]
        );
        assert_eq!(
            names(&[facet(&["ext4", "calm-remote", "calm"])]),
            ["calm-remote", "calm", "ext4"]
        );
        let many: Vec<String> = (0..=SERIES_MAX).map(|i| format!("s{i}")).collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        let dir = tempfile::tempdir().unwrap();
        let outcome = small_multiples_svg(&dir.path().join("p.svg"), "t", &[facet(&refs)]);
        assert!(outcome.unwrap_err().contains("told apart"));
    }
}
