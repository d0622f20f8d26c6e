//! Pure helpers: latency summaries (exact percentiles over a sorted sample) and the
//! inversion count of a grant order.

use std::time::Duration;

use serde::Serialize;

/// A latency sample, summarised. Every figure is in microseconds.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Latency {
    /// How many observations.
    pub(crate) count: usize,
    pub(crate) mean_us: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) max_us: f64,
}

impl Latency {
    /// Summarise `sample` (any order).
    pub(crate) fn of(sample: &[Duration]) -> Latency {
        let mut us: Vec<f64> = sample.iter().map(|d| d.as_secs_f64() * 1e6).collect();
        us.sort_by(f64::total_cmp);
        let count = us.len();
        let mean_us = if count == 0 {
            0.0
        } else {
            us.iter().sum::<f64>() / count as f64
        };
        Latency {
            count,
            mean_us,
            p50_us: percentile(&us, 50.0),
            p99_us: percentile(&us, 99.0),
            max_us: us.last().copied().unwrap_or(0.0),
        }
    }
}

/// The `p`-th percentile (nearest rank) of `sorted` (ascending); 0 for an empty sample.
pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// How many pairs `(i, j)` with `i < j` have `order[i] > order[j]`: 0 when the grants came in
/// arrival order. `order[k]` is the arrival index of the k-th grant. O(n log n) (merge sort).
pub(crate) fn inversions(order: &[usize]) -> u64 {
    fn sort_count(v: &mut [usize], buf: &mut Vec<usize>) -> u64 {
        if v.len() < 2 {
            return 0;
        }
        let mid = v.len() / 2;
        let mut n = sort_count(&mut v[..mid], buf) + sort_count(&mut v[mid..], buf);
        buf.clear();
        let (mut i, mut j) = (0, mid);
        while i < mid && j < v.len() {
            if v[i] <= v[j] {
                buf.push(v[i]);
                i += 1;
            } else {
                // Every element left in the first half is larger than v[j].
                n += (mid - i) as u64;
                buf.push(v[j]);
                j += 1;
            }
        }
        buf.extend_from_slice(&v[i..mid]);
        buf.extend_from_slice(&v[j..]);
        v.copy_from_slice(buf);
        n
    }
    let mut v = order.to_vec();
    sort_count(&mut v, &mut Vec::with_capacity(order.len()))
}

/// `n / seconds`, 0 for an empty interval.
pub(crate) fn rate(n: u64, elapsed: Duration) -> f64 {
    let s = elapsed.as_secs_f64();
    if s > 0.0 { n as f64 / s } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }

    #[test]
    fn a_latency_summary_is_in_microseconds_whatever_the_input_order() {
        let sample: Vec<Duration> = [3u64, 1, 2, 4]
            .iter()
            .map(|&ms| Duration::from_millis(ms))
            .collect();
        let l = Latency::of(&sample);
        assert_eq!(l.count, 4);
        assert_eq!(l.p50_us, 2000.0);
        assert_eq!(l.p99_us, 4000.0);
        assert_eq!(l.max_us, 4000.0);
        assert_eq!(l.mean_us, 2500.0);
    }

    #[test]
    fn arrival_order_has_no_inversions_and_reverse_order_has_all() {
        assert_eq!(inversions(&[]), 0);
        assert_eq!(inversions(&[0, 1, 2, 3, 4]), 0);
        assert_eq!(inversions(&[4, 3, 2, 1, 0]), 10);
        assert_eq!(inversions(&[1, 0, 2, 4, 3]), 2);
    }

    #[test]
    fn inversions_match_the_quadratic_definition() {
        let order = [5, 1, 9, 3, 3, 0, 8, 2, 7, 6, 4];
        let mut naive = 0;
        for i in 0..order.len() {
            for j in i + 1..order.len() {
                if order[i] > order[j] {
                    naive += 1;
                }
            }
        }
        assert_eq!(inversions(&order), naive);
    }
}
