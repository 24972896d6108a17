//! NaN-propagating reductions for the reported statistics.
//!
//! `f64::max(a, NaN)` is `a`, so `fold(f64::NEG_INFINITY, f64::max)` over values containing a
//! NaN reports the largest *finite* value: a NaN log-prob would read as perfect parity, a NaN
//! ratio as a ratio in the band. These folds return NaN instead, so the metric shows it.

/// The largest value; NaN if any value is NaN; `-inf` for no values.
pub(crate) fn nan_max(values: impl IntoIterator<Item = f64>) -> f64 {
    values.into_iter().fold(f64::NEG_INFINITY, |m, x| {
        if m.is_nan() || x.is_nan() {
            f64::NAN
        } else {
            m.max(x)
        }
    })
}

/// The smallest value; NaN if any value is NaN; `+inf` for no values.
pub(crate) fn nan_min(values: impl IntoIterator<Item = f64>) -> f64 {
    values.into_iter().fold(f64::INFINITY, |m, x| {
        if m.is_nan() || x.is_nan() {
            f64::NAN
        } else {
            m.min(x)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::{nan_max, nan_min};

    #[test]
    fn min_and_max_of_finite_values() {
        assert_eq!(nan_max([1.0, -2.0, 3.0]), 3.0);
        assert_eq!(nan_min([1.0, -2.0, 3.0]), -2.0);
        assert_eq!(nan_max([f64::INFINITY, 0.0]), f64::INFINITY);
        assert_eq!(nan_min(std::iter::empty()), f64::INFINITY);
        assert_eq!(nan_max(std::iter::empty()), f64::NEG_INFINITY);
    }

    #[test]
    fn a_nan_anywhere_gives_nan() {
        for at in 0..3 {
            let mut v = [1.0, -2.0, 3.0];
            v[at] = f64::NAN;
            assert!(nan_max(v).is_nan(), "max dropped the NaN at {at}");
            assert!(nan_min(v).is_nan(), "min dropped the NaN at {at}");
        }
    }
}
