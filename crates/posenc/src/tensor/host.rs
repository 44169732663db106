//! Host-side helpers shared by the learned biases (FIRE, CoPE, forgetting
//! attention): positions read from [`Positions`] and size bounds.

use super::Positions;
use crate::error::{Error, Result};

/// Largest number of elements a learned bias allocates in one tensor
/// (2^31): larger requests are a typed error, not an allocation failure.
pub(crate) const MAX_ELEMENTS: usize = 1 << 31;

/// Positions of `len` steps: shared by the batch (`rows = None`) or one row
/// per batch entry (`data` is `rows × len`, row-major).
#[derive(Debug, Clone)]
pub(crate) struct HostPositions {
    pub rows: Option<usize>,
    pub len: usize,
    pub data: Vec<u64>,
}

impl HostPositions {
    /// Position of step `i` of batch row `b` (`b` ignored when shared).
    pub fn get(&self, b: usize, i: usize) -> u64 {
        match self.rows {
            None => self.data[i],
            Some(_) => self.data[b * self.len + i],
        }
    }

    /// The largest position (0 when empty).
    pub fn max(&self) -> u64 {
        self.data.iter().copied().max().unwrap_or(0)
    }
}

/// Reads `len` positions: `offset..offset + len`, or a `(B, len)` id tensor
/// (`u8`, `u32` or `i64`, non-negative).
pub(crate) fn read_positions(
    p: Positions<'_>,
    len: usize,
    what: &'static str,
) -> Result<HostPositions> {
    checked_elements(what, &[len])?;
    match p {
        Positions::Offset(o) => {
            let end = o.checked_add(len).ok_or(Error::PositionOutOfRange {
                position: u64::MAX,
                limit: usize::MAX as u64,
                what: "offset + length",
            })?;
            Ok(HostPositions {
                rows: None,
                len,
                data: (o as u64..end as u64).collect(),
            })
        }
        Positions::Ids(ids) => {
            let b = match ids.dims() {
                &[b, t] if t == len => b,
                dims => {
                    return Err(Error::Shape {
                        what,
                        expected: format!("(B, {len})"),
                        got: format!("{dims:?}"),
                    })
                }
            };
            let data = super::ids_to_u64(ids, true)?;
            Ok(HostPositions {
                rows: Some(b),
                len,
                data,
            })
        }
    }
}

/// The batch both position sets agree on: `None` when both are shared.
pub(crate) fn common_rows(a: &HostPositions, b: &HostPositions) -> Result<Option<usize>> {
    match (a.rows, b.rows) {
        (Some(x), Some(y)) if x != y => Err(Error::Shape {
            what: "key position ids",
            expected: format!("{x} rows, as the query position ids"),
            got: format!("{y} rows"),
        }),
        (Some(x), _) | (_, Some(x)) => Ok(Some(x)),
        (None, None) => Ok(None),
    }
}

/// `∏ dims`, checked against [`MAX_ELEMENTS`].
pub(crate) fn checked_elements(what: &'static str, dims: &[usize]) -> Result<usize> {
    let n = dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= MAX_ELEMENTS);
    n.ok_or_else(|| {
        Error::invalid(
            what,
            format!("{dims:?} is more than {MAX_ELEMENTS} elements"),
        )
    })
}
