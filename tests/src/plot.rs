//! The benches' plots (SVG, drawn with `plotters`), committed beside docs/BENCHMARKS.md in
//! `docs/bench/`.

use std::path::Path;

use plotters::prelude::*;

/// Draws the runtime's resident set against synced objects (`points`: objects, MiB) and its
/// peak, as SVG at `path`.
///
/// # Panics
/// When the file cannot be written.
pub fn rss(path: &Path, points: &[(usize, f64)], peak: f64) {
    let root = SVGBackend::new(path, (720, 420)).into_drawing_area();
    root.fill(&WHITE).expect("plot");
    let x_max = points.iter().map(|p| p.0).max().unwrap_or(1) as f64;
    let y_max = peak.max(points.iter().map(|p| p.1).fold(0.0, f64::max)) * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "vcluster-plugin-syncer: resident set against synced Cars",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..x_max * 1.02, 0f64..y_max)
        .expect("plot");
    chart
        .configure_mesh()
        .x_desc("Cars synced (each: one virtual object and its host copy)")
        .y_desc("MiB")
        .draw()
        .expect("plot");
    let line: Vec<(f64, f64)> = points.iter().map(|(n, m)| (*n as f64, *m)).collect();
    chart
        .draw_series(LineSeries::new(line.clone(), &BLUE))
        .expect("plot")
        .label("VmRSS after each chunk")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
    chart
        .draw_series(line.iter().map(|p| Circle::new(*p, 3, BLUE.filled())))
        .expect("plot");
    chart
        .draw_series(LineSeries::new(vec![(0.0, peak), (x_max, peak)], &RED))
        .expect("plot")
        .label(format!("peak (VmHWM) {peak:.1} MiB"))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE)
        .border_style(BLACK)
        .draw()
        .expect("plot");
    root.present().expect("write the plot");
}

/// Draws latency percentiles (x: percentile 0–100, y: ms) of each series (sorted ascending,
/// milliseconds; the legend names it), as SVG at `path`, titled `title`.
///
/// # Panics
/// When the file cannot be written.
pub fn latency(path: &Path, title: &str, series: &[(&str, &Vec<f64>)]) {
    let root = SVGBackend::new(path, (720, 420)).into_drawing_area();
    root.fill(&WHITE).expect("plot");
    let y_max = series
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .fold(1.0, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..100f64, 0f64..y_max)
        .expect("plot");
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("ms")
        .draw()
        .expect("plot");
    for (i, (name, values)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let line: Vec<(f64, f64)> = values
            .iter()
            .enumerate()
            .map(|(k, v)| (k as f64 * 100.0 / (values.len().max(2) - 1) as f64, *v))
            .collect();
        chart
            .draw_series(LineSeries::new(line, color.stroke_width(2)))
            .expect("plot")
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE)
        .border_style(BLACK)
        .draw()
        .expect("plot");
    root.present().expect("write the plot");
}
