//! Kubernetes resource quantities (`100m`, `1.5`, `256Mi`, `1e3`), read into exact amounts so
//! that requests, limits, LimitRanges, ResourceQuotas and nodes' allocatable can be compared
//! and added (pure).
//!
//! The grammar is Kubernetes' (`k8s.io/apimachinery/pkg/api/resource/quantity.go`):
//! a signed decimal number, then a suffix: a binary SI one (`Ki`, `Mi`, `Gi`, `Ti`, `Pi`,
//! `Ei`: powers of 1024), a decimal SI one (`n`, `u`, `m`, none, `k`, `M`, `G`, `T`, `P`, `E`),
//! or a decimal exponent (`e3`, `E-2`). An amount is held in units of 10⁻⁹ (the smallest
//! suffix, `n`) as an `i128`, exact up to 10²⁹ units; a value with finer digits is rounded up,
//! as Kubernetes rounds a quantity up to its smallest scale.

use thiserror::Error;

/// An exact amount in units of 10⁻⁹ (`1` is `1n`, `1_000_000` is `1m`, `10⁹` is `1`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Amount(pub i128);

/// Why a quantity cannot be read.
#[derive(Debug, Error, PartialEq, Eq)]
#[error(
    "{text:?} is not a Kubernetes quantity ({why}): write a number with an optional suffix, such as 100m, 2, 256Mi or 1e3"
)]
pub struct QuantityError {
    /// The text read.
    pub text: String,
    /// What is wrong with it.
    pub why: &'static str,
}

const NANO: i128 = 1_000_000_000;

impl Amount {
    /// Reads `text` (see the module docs).
    ///
    /// # Errors
    /// A [`QuantityError`] when `text` is not a quantity or too large to hold.
    pub fn parse(text: &str) -> Result<Amount, QuantityError> {
        let err = |why| QuantityError {
            text: text.to_string(),
            why,
        };
        let s = text.trim();
        let (negative, s) = match s.as_bytes().first() {
            Some(b'-') => (true, &s[1..]),
            Some(b'+') => (false, &s[1..]),
            _ => (false, s),
        };
        let number_len = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (number, suffix) = s.split_at(number_len);
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && fraction.is_empty() {
            return Err(err("no digits"));
        }
        if fraction.contains('.') {
            return Err(err("more than one decimal point"));
        }
        // value = digits / 10^fraction.len() * numerator / denominator
        let digits: String = format!("{whole}{fraction}");
        let digits: i128 = digits.parse().map_err(|_| err("too many digits"))?;
        let (numerator, denominator): (i128, i128) = match suffix {
            "Ki" => (1 << 10, 1),
            "Mi" => (1 << 20, 1),
            "Gi" => (1 << 30, 1),
            "Ti" => (1 << 40, 1),
            "Pi" => (1 << 50, 1),
            "Ei" => (1 << 60, 1),
            "n" => (1, NANO),
            "u" => (1, 1_000_000),
            "m" => (1, 1_000),
            "" => (1, 1),
            "k" => (1_000, 1),
            "M" => (1_000_000, 1),
            "G" => (NANO, 1),
            "T" => (1_000_000_000_000, 1),
            "P" => (1_000_000_000_000_000, 1),
            "E" => (1_000_000_000_000_000_000, 1),
            exponent if exponent.starts_with(['e', 'E']) => {
                let e: i32 = exponent[1..].parse().map_err(|_| err("a bad exponent"))?;
                if !(-9..=29).contains(&e) {
                    return Err(err("an exponent out of range"));
                }
                let p = 10i128.pow(e.unsigned_abs());
                if e >= 0 { (p, 1) } else { (1, p) }
            }
            _ => return Err(err("an unknown suffix")),
        };
        let scale = 10i128
            .checked_pow(u32::try_from(fraction.len()).map_err(|_| err("too many digits"))?)
            .ok_or_else(|| err("too many digits"))?;
        let top = digits
            .checked_mul(numerator)
            .and_then(|v| v.checked_mul(NANO))
            .ok_or_else(|| err("too large"))?;
        let bottom = scale * denominator;
        // rounded up to a whole unit of 10⁻⁹
        let value = top / bottom + i128::from(top % bottom != 0);
        Ok(Amount(if negative { -value } else { value }))
    }

    /// The amount as Kubernetes would print it for `resource`: CPU in millicores (`250m`,
    /// rounded up), other resources in whole units with the largest binary suffix that divides
    /// them (`256Mi`, `1000`).
    pub fn display(self, resource: &str) -> String {
        if resource.ends_with("cpu") {
            let milli = self.0 / 1_000_000 + i128::from(self.0 % 1_000_000 != 0);
            return if milli % 1000 == 0 {
                format!("{}", milli / 1000)
            } else {
                format!("{milli}m")
            };
        }
        let units = self.0 / NANO + i128::from(self.0 % NANO != 0);
        for (suffix, shift) in [
            ("Ei", 60),
            ("Pi", 50),
            ("Ti", 40),
            ("Gi", 30),
            ("Mi", 20),
            ("Ki", 10),
        ] {
            let base = 1i128 << shift;
            if units != 0 && units % base == 0 {
                return format!("{}{suffix}", units / base);
            }
        }
        units.to_string()
    }
}

impl std::ops::Add for Amount {
    type Output = Amount;
    fn add(self, other: Amount) -> Amount {
        Amount(self.0.saturating_add(other.0))
    }
}

impl std::ops::Sub for Amount {
    type Output = Amount;
    fn sub(self, other: Amount) -> Amount {
        Amount(self.0.saturating_sub(other.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(text: &str) -> i128 {
        Amount::parse(text).unwrap().0
    }

    /// The examples of Kubernetes' documentation ("Resource units in Kubernetes") and of
    /// `quantity.go`.
    #[test]
    fn quantities_read_as_kubernetes_reads_them() {
        assert_eq!(n("100m"), 100_000_000);
        assert_eq!(n("0.1"), n("100m"));
        assert_eq!(n("1"), NANO);
        assert_eq!(n("2.5"), 2_500_000_000);
        assert_eq!(n("128974848"), 128_974_848 * NANO);
        assert_eq!(n("129e6"), 129_000_000 * NANO);
        assert_eq!(n("129M"), n("129e6"));
        assert_eq!(n("128974848000m"), n("128974848"));
        assert_eq!(n("123Mi"), 128_974_848 * NANO);
        assert_eq!(n("1Ki"), 1024 * NANO);
        assert_eq!(n("1Gi"), (1 << 30) * NANO);
        assert_eq!(n("100Ti"), (100i128 << 40) * NANO);
        assert_eq!(n("1E"), 10i128.pow(18) * NANO);
        assert_eq!(n("8Ei"), (8i128 << 60) * NANO);
        assert_eq!(n("1n"), 1);
        assert_eq!(n("1u"), 1000);
        assert_eq!(n("1e-3"), n("1m"));
        assert_eq!(n("1.5Gi"), (3i128 << 29) * NANO);
        assert_eq!(n(".5"), n("500m"));
        assert_eq!(n("+1"), n("1"));
        assert_eq!(n("-1"), -n("1"));
        // finer than 1n: rounded up
        assert_eq!(n("0.0000000001"), 1);
        assert_eq!(n("1Mi") - n("1M"), 48_576 * NANO);
        for bad in ["", "Mi", "1.2.3", "1x", "1 Mi", "1ee", "e3", "1e99"] {
            assert!(Amount::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn amounts_print_as_kubernetes_prints_them() {
        assert_eq!(Amount(n("250m")).display("cpu"), "250m");
        assert_eq!(Amount(n("2")).display("requests.cpu"), "2");
        assert_eq!(Amount(n("1n")).display("cpu"), "1m");
        assert_eq!(Amount(n("256Mi")).display("memory"), "256Mi");
        assert_eq!(Amount(n("1Gi") + n("512Mi")).display("memory"), "1536Mi");
        assert_eq!(Amount(n("1000")).display("memory"), "1000");
        assert_eq!(Amount(0).display("memory"), "0");
    }
}
