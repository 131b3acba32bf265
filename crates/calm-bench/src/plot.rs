//! SVG plots of benchmark curves over N (log–log), for `--plot FILE`.

use std::path::Path;

use plotters::prelude::*;

/// One named curve: (x, y) points.
pub type Series = (String, Vec<(f64, f64)>);

/// Draws `series` on log–log axes into an SVG file at `path`.
pub fn log_log_svg(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> Result<(), String> {
    let points = series.iter().flat_map(|(_, p)| p.iter());
    let (mut x_min, mut x_max, mut y_min, mut y_max) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for (x, y) in points {
        x_min = x_min.min(*x);
        x_max = x_max.max(*x);
        y_min = y_min.min(*y);
        y_max = y_max.max(*y);
    }
    if x_min > x_max {
        return Err("nothing to plot".into());
    }
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| format!("plotting {}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(
            (x_min * 0.8..x_max * 1.25).log_scale(),
            ((y_min * 0.5).max(1e-3)..y_max * 2.0).log_scale(),
        )
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_desc(y_label)
        .draw()
        .map_err(|e| err(&e))?;
    // Distinct colours for up to twelve curves (then they repeat).
    let colors = [
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
    for (i, (name, points)) in series.iter().enumerate() {
        let color = colors[i % colors.len()];
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(|e| err(&e))?
            .label(name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        chart
            .draw_series(points.iter().map(|p| Circle::new(*p, 4, color.filled())))
            .map_err(|e| err(&e))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
