//! Repeated benchmark runs and their last line: every bench figure is the median of
//! `BENCH_RUNS` runs (default [`DEFAULT_RUNS`]), printed with its minimum and maximum
//! (a figure that meets its target in one run only does not meet it).
//!
//! A run collects its figures in a [`Figures`] (name, value, decimals, in the order they are
//! pushed); [`median_line`] turns the runs into the last line,
//! `name=<median>[<min>..<max>] … runs=<n>`, one `key=value` token per figure, so that a
//! reader that splits on spaces and `=` still finds every figure.

/// Runs of a bench when `BENCH_RUNS` is not set.
pub const DEFAULT_RUNS: usize = 3;

/// `BENCH_RUNS` from the environment (at least 1), or [`DEFAULT_RUNS`].
///
/// # Panics
/// When `BENCH_RUNS` is set to something other than a positive count.
#[must_use]
pub fn runs() -> usize {
    match std::env::var("BENCH_RUNS") {
        Err(_) => DEFAULT_RUNS,
        Ok(v) => match v.parse::<usize>() {
            Ok(n) if n >= 1 => n,
            _ => panic!("BENCH_RUNS must be a positive count, not {v:?}"),
        },
    }
}

/// One run's figures, in the order they go on the last line.
#[derive(Clone, Debug, Default)]
pub struct Figures(Vec<(String, f64, usize)>);

impl Figures {
    /// Adds figure `name` with `value`, printed with `decimals` digits after the point.
    pub fn push(&mut self, name: &str, value: f64, decimals: usize) {
        self.0.push((name.to_string(), value, decimals));
    }

    /// The value of figure `name`, if the run has it.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<f64> {
        self.0
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, v, _)| *v)
    }

    /// This run's figures as one line, `name=<value> …` (what a run prints for itself).
    #[must_use]
    pub fn line(&self) -> String {
        self.0
            .iter()
            .map(|(n, v, d)| format!("{n}={v:.d$}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// The median of `values` (the middle one of an odd count, the mean of the two middle ones of
/// an even count); `NaN` for none.
#[must_use]
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => f64::midpoint(v[n / 2 - 1], v[n / 2]),
    }
}

/// The last line of a bench of `runs`: for each figure of the first run, in its order,
/// `name=<median>[<min>..<max>]` over the runs that have it, then `runs=<n>`.
#[must_use]
pub fn median_line(runs: &[Figures]) -> String {
    let mut out = Vec::new();
    if let Some(first) = runs.first() {
        for (name, _, d) in &first.0 {
            let values: Vec<f64> = runs.iter().filter_map(|r| r.get(name)).collect();
            let min = values.iter().copied().fold(f64::INFINITY, f64::min);
            let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let d = *d;
            out.push(format!(
                "{name}={:.d$}[{min:.d$}..{max:.d$}]",
                median(&values)
            ));
        }
    }
    out.push(format!("runs={}", runs.len()));
    out.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(pairs: &[(&str, f64)]) -> Figures {
        let mut f = Figures::default();
        for (n, v) in pairs {
            f.push(n, *v, 2);
        }
        f
    }

    #[test]
    fn the_median_is_the_middle_value_or_the_mean_of_the_two_middle_ones() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[7.0]), 7.0);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn the_last_line_gives_each_figure_median_min_and_max_in_the_first_runs_order() {
        let runs = [
            run(&[("ratio", 1.07), ("rss", 60.0)]),
            run(&[("ratio", 1.91), ("rss", 70.0)]),
            run(&[("ratio", 0.88), ("rss", 65.0)]),
        ];
        assert_eq!(
            median_line(&runs),
            "ratio=1.07[0.88..1.91] rss=65.00[60.00..70.00] runs=3"
        );
    }

    #[test]
    fn one_run_gives_its_own_value_as_median_min_and_max() {
        let mut f = Figures::default();
        f.push("writes", 0.0, 0);
        f.push("p50_ms", 5.44, 1);
        assert_eq!(f.line(), "writes=0 p50_ms=5.4");
        assert_eq!(
            median_line(&[f]),
            "writes=0[0..0] p50_ms=5.4[5.4..5.4] runs=1"
        );
    }
}
