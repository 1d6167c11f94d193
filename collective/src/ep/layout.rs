//! Where each call's bytes live in a rank's EP data area, from the call's shape.
//!
//! `T` = max dispatch tokens per rank, `H` = hidden, `E` = experts, `R` = ranks,
//! `L = E / R` local experts, `W = 2H` bytes per row slot (a bf16 row; an fp8 row with its
//! scales, `H + 4H/128`, fits in it). Offsets are from the start of the data area:
//!
//! ```text
//! dispatch set i (i = 0, 1), at i * DS, DS = R * B:
//!   block of source rank s, at i*DS + s*B, B = 4L + 4LT + LTW:
//!     counts  [L] u32            rows source s sent to each local expert
//!     src     [L][T] i32         each row's token index at its source
//!     rows    [L][T] W bytes     the rows; for fp8 expert l's T*W bytes hold
//!                                [T][H] fp8 data, then [T][H/128] f32 scales, so that
//!                                the receiver copies each into its tensor in one piece
//! combine set i, at 2*DS + i*CS, CS = 4ET + ETW:
//!     stamps  [E][T] u32         combine call that last wrote row (e, t)
//!     rows    [E][T] W bytes     expert e's output for this rank's token t
//! ```
//!
//! Total `2(DS + CS) = 8E + 16ET + 8HET` bytes, never more than upstream's size hint
//! `16E + 4ET(32 + 2H)`, so a buffer sized by `get_ep_buffer_size_hint` always fits.

/// The shape of one dispatch/combine call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// `num_max_dispatch_tokens_per_rank` (T).
    pub tokens_max: usize,
    /// Hidden size (H), a multiple of 128.
    pub hidden: usize,
    /// Experts in the group (E), a multiple of the group size.
    pub experts: usize,
    /// Ranks in the group (R).
    pub ranks: usize,
}

/// Channels per fp8 scale.
pub const FP8_GROUP: usize = 128;

impl Shape {
    /// Local experts per rank (L).
    pub fn local(&self) -> usize {
        self.experts / self.ranks
    }

    /// Bytes of one bf16 row.
    pub fn row_bytes(&self) -> usize {
        2 * self.hidden
    }

    /// Bytes of one fp8 row with its scales.
    pub fn fp8_row_bytes(&self) -> usize {
        self.hidden + 4 * (self.hidden / FP8_GROUP)
    }

    /// Checks the shape; the message says what was expected and what arrived.
    pub fn check(&self) -> Result<(), String> {
        if self.ranks == 0 || self.ranks > super::EP_MAX_RANKS {
            return Err(format!(
                "group of {} ranks: 1..={} supported",
                self.ranks,
                super::EP_MAX_RANKS
            ));
        }
        if self.tokens_max == 0 || self.tokens_max > super::EP_MAX_TOKENS_PER_RANK {
            return Err(format!(
                "num_max_dispatch_tokens_per_rank must be in 1..={}, got {}",
                super::EP_MAX_TOKENS_PER_RANK,
                self.tokens_max
            ));
        }
        if self.hidden == 0 || !self.hidden.is_multiple_of(FP8_GROUP) {
            return Err(format!(
                "hidden must be a positive multiple of {FP8_GROUP}, got {}",
                self.hidden
            ));
        }
        if self.experts == 0 || !self.experts.is_multiple_of(self.ranks) {
            return Err(format!(
                "num_experts ({}) must be a positive multiple of the group size ({})",
                self.experts, self.ranks
            ));
        }
        if self.local() > super::EP_MAX_LOCAL_EXPERTS {
            return Err(format!(
                "{} local experts per rank, at most {} supported",
                self.local(),
                super::EP_MAX_LOCAL_EXPERTS
            ));
        }
        Ok(())
    }

    fn block_bytes(&self) -> usize {
        let (l, t) = (self.local(), self.tokens_max);
        4 * l + 4 * l * t + l * t * self.row_bytes()
    }

    fn dispatch_set_bytes(&self) -> usize {
        self.ranks * self.block_bytes()
    }

    fn combine_set_bytes(&self) -> usize {
        let et = self.experts * self.tokens_max;
        4 * et + et * self.row_bytes()
    }

    /// Bytes of the data area this shape needs.
    pub fn need_bytes(&self) -> usize {
        2 * (self.dispatch_set_bytes() + self.combine_set_bytes())
    }

    /// Offset of the dispatch block source `s` writes in set `set`.
    pub fn block(&self, set: usize, s: usize) -> usize {
        (set & 1) * self.dispatch_set_bytes() + s * self.block_bytes()
    }

    /// Offset of the counts of a block.
    pub fn counts(&self, set: usize, s: usize) -> usize {
        self.block(set, s)
    }

    /// Offset of the source-token index of row `i` of local expert `l` in a block.
    pub fn src(&self, set: usize, s: usize, l: usize, i: usize) -> usize {
        self.block(set, s) + 4 * self.local() + 4 * (l * self.tokens_max + i)
    }

    /// Offset of row `i` of local expert `l` in a block.
    pub fn row(&self, set: usize, s: usize, l: usize, i: usize) -> usize {
        let (lo, t) = (self.local(), self.tokens_max);
        self.block(set, s) + 4 * lo + 4 * lo * t + (l * t + i) * self.row_bytes()
    }

    /// Offset of the fp8 data of row `i` of local expert `l` in a block (fp8 calls).
    pub fn fp8_data(&self, set: usize, s: usize, l: usize, i: usize) -> usize {
        self.row(set, s, l, 0) + i * self.hidden
    }

    /// Offset of the f32 scales of row `i` of local expert `l` in a block (fp8 calls): after
    /// the expert's `T` rows of data, inside its `T * W` bytes since `H + 4H/128 <= 2H`.
    pub fn fp8_scales(&self, set: usize, s: usize, l: usize, i: usize) -> usize {
        let scale_bytes = 4 * (self.hidden / FP8_GROUP);
        self.row(set, s, l, 0) + self.tokens_max * self.hidden + i * scale_bytes
    }

    fn combine_set(&self, set: usize) -> usize {
        2 * self.dispatch_set_bytes() + (set & 1) * self.combine_set_bytes()
    }

    /// Offset of the stamp of combine row (expert `e`, token `t`).
    pub fn stamp(&self, set: usize, e: usize, t: usize) -> usize {
        self.combine_set(set) + 4 * (e * self.tokens_max + t)
    }

    /// Offset of combine row (expert `e`, token `t`).
    pub fn combine_row(&self, set: usize, e: usize, t: usize) -> usize {
        let et = self.experts * self.tokens_max;
        self.combine_set(set) + 4 * et + (e * self.tokens_max + t) * self.row_bytes()
    }
}

/// Upstream's `get_ep_buffer_size_hint`: `16E + 4ET(32 + 2H)` (the group size is unused).
pub fn size_hint(tokens_max: u64, hidden: u64, experts: u64) -> Option<u64> {
    let row = hidden.checked_mul(2)?.checked_add(32)?;
    let send_recv = experts.checked_mul(tokens_max)?.checked_mul(row)?;
    experts
        .checked_mul(16)?
        .checked_add(send_recv.checked_mul(4)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hint_matches_upstream_examples() {
        assert_eq!(size_hint(128, 7168, 288), Some(2_118_652_416));
        assert_eq!(size_hint(256, 2048, 288), Some(1_217_401_344));
    }

    #[test]
    fn layout_fits_in_the_hint_and_does_not_overlap() {
        for &(t, h, e, r) in &[
            (1, 128, 1, 1),
            (1, 128, 2, 2),
            (7, 256, 6, 3),
            (128, 2048, 32, 2),
            (128, 7168, 288, 8),
        ] {
            let s = Shape {
                tokens_max: t,
                hidden: h,
                experts: e,
                ranks: r,
            };
            s.check().unwrap();
            let need = s.need_bytes() as u64;
            assert!(need <= size_hint(t as u64, h as u64, e as u64).unwrap());
            assert!(s.fp8_row_bytes() <= s.row_bytes());
            let l = s.local();
            // an expert's fp8 data and scales stay inside its T rows, and do not overlap
            for ex in 0..l {
                let g = 4 * (h / FP8_GROUP);
                assert_eq!(s.fp8_data(0, 0, ex, 0), s.row(0, 0, ex, 0));
                assert!(s.fp8_data(0, 0, ex, t - 1) + h <= s.fp8_scales(0, 0, ex, 0));
                assert!(
                    s.fp8_scales(0, 0, ex, t - 1) + g <= s.row(0, 0, ex, t - 1) + s.row_bytes()
                );
            }
            // the last byte of each region is below the start of the next one
            assert!(s.row(0, r - 1, l - 1, t - 1) + s.row_bytes() <= s.block(1, 0));
            assert!(s.row(1, r - 1, l - 1, t - 1) + s.row_bytes() <= s.stamp(0, 0, 0));
            assert!(s.stamp(0, e - 1, t - 1) + 4 <= s.combine_row(0, 0, 0));
            assert!(s.combine_row(0, e - 1, t - 1) + s.row_bytes() <= s.stamp(1, 0, 0));
            assert_eq!(
                s.combine_row(1, e - 1, t - 1) + s.row_bytes(),
                s.need_bytes()
            );
        }
    }

    #[test]
    fn bad_shapes_are_refused() {
        let ok = Shape {
            tokens_max: 4,
            hidden: 256,
            experts: 4,
            ranks: 2,
        };
        assert!(ok.check().is_ok());
        assert!(Shape { hidden: 100, ..ok }.check().is_err());
        assert!(Shape { experts: 3, ..ok }.check().is_err());
        assert!(Shape {
            tokens_max: 0,
            ..ok
        }
        .check()
        .is_err());
    }
}
