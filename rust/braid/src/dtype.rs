//! Element types: [`DType`] (the reference's, with its codes) and the Rust
//! types the safe slice API accepts ([`Element`]).
use std::fmt;

/// Data types, with the reference's (numr's) variant names and stable
/// discriminants, which are also `braid_dtype`'s codes.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[repr(u8)]
pub enum DType {
    /// 64-bit floating point
    F64 = 0,
    /// 32-bit floating point
    F32 = 1,
    /// 16-bit floating point (IEEE 754 binary16)
    F16 = 2,
    /// 16-bit brain floating point
    BF16 = 3,
    /// 8-bit floating point, OCP E4M3FN (no infinities, max 448)
    FP8E4M3 = 4,
    /// 8-bit floating point, OCP E5M2 (IEEE-like, with infinities)
    FP8E5M2 = 5,
    /// 64-bit signed integer
    I64 = 10,
    /// 32-bit signed integer
    I32 = 11,
    /// 16-bit signed integer
    I16 = 12,
    /// 8-bit signed integer
    I8 = 13,
    /// 64-bit unsigned integer
    U64 = 20,
    /// 32-bit unsigned integer
    U32 = 21,
    /// 16-bit unsigned integer
    U16 = 22,
    /// 8-bit unsigned integer
    U8 = 23,
    /// Boolean, one byte (any non-zero byte is true; braid's results are 0 or 1)
    Bool = 30,
    /// Complex of two f32 (re, im)
    Complex64 = 40,
    /// Complex of two f64 (re, im)
    Complex128 = 41,
}

impl DType {
    /// Size of one element in bytes.
    #[inline]
    pub const fn size_in_bytes(self) -> usize {
        match self {
            Self::Complex128 => 16,
            Self::F64 | Self::I64 | Self::U64 | Self::Complex64 => 8,
            Self::F32 | Self::I32 | Self::U32 => 4,
            Self::F16 | Self::BF16 | Self::I16 | Self::U16 => 2,
            Self::FP8E4M3 | Self::FP8E5M2 | Self::I8 | Self::U8 | Self::Bool => 1,
        }
    }

    /// Short name, as numr spells it ("f32", "fp8e4m3", "c64", ...).
    pub const fn short_name(self) -> &'static str {
        match self {
            Self::F64 => "f64",
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::BF16 => "bf16",
            Self::FP8E4M3 => "fp8e4m3",
            Self::FP8E5M2 => "fp8e5m2",
            Self::I64 => "i64",
            Self::I32 => "i32",
            Self::I16 => "i16",
            Self::I8 => "i8",
            Self::U64 => "u64",
            Self::U32 => "u32",
            Self::U16 => "u16",
            Self::U8 => "u8",
            Self::Bool => "bool",
            Self::Complex64 => "c64",
            Self::Complex128 => "c128",
        }
    }

    /// The `braid_dtype` code (the discriminant).
    #[inline]
    pub const fn code(self) -> i32 {
        self as u8 as i32
    }

    /// The DType of a `braid_dtype` code.
    pub fn from_code(code: i32) -> Option<DType> {
        const ALL: [DType; 17] = [
            DType::F64,
            DType::F32,
            DType::F16,
            DType::BF16,
            DType::FP8E4M3,
            DType::FP8E5M2,
            DType::I64,
            DType::I32,
            DType::I16,
            DType::I8,
            DType::U64,
            DType::U32,
            DType::U16,
            DType::U8,
            DType::Bool,
            DType::Complex64,
            DType::Complex128,
        ];
        ALL.iter().copied().find(|d| d.code() == code)
    }

    /// True for the floating-point types (F64 .. FP8E5M2).
    pub const fn is_float(self) -> bool {
        matches!(self, Self::F64 | Self::F32 | Self::F16 | Self::BF16 | Self::FP8E4M3 | Self::FP8E5M2)
    }

    /// True for Complex64 and Complex128.
    pub const fn is_complex(self) -> bool {
        matches!(self, Self::Complex64 | Self::Complex128)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.short_name())
    }
}

/// IEEE 754 binary16, as its bits.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct F16(pub u16);

/// bfloat16, as its bits.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct BF16(pub u16);

impl BF16 {
    /// The bfloat16 nearest to `x` (ties to even; NaN stays NaN).
    pub fn from_f32(x: f32) -> BF16 {
        let b = x.to_bits();
        if x.is_nan() {
            return BF16(((b >> 16) as u16) | 0x40);
        }
        let round = 0x7fff + ((b >> 16) & 1);
        BF16((b.wrapping_add(round) >> 16) as u16)
    }

    /// The f32 of the same value (exact).
    pub fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
}

/// 8-bit float E4M3FN, as its bits.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct FP8E4M3(pub u8);

/// 8-bit float E5M2, as its bits.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct FP8E5M2(pub u8);

/// One byte of braid's `bool`: any non-zero byte is true. A byte rather than
/// Rust's `bool`, whose only valid bytes are 0 and 1, because a received or
/// broadcast byte is whatever the sender had.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct Bool(pub u8);

impl Bool {
    pub fn get(self) -> bool {
        self.0 != 0
    }
}

impl From<bool> for Bool {
    fn from(b: bool) -> Bool {
        Bool(b as u8)
    }
}

/// Complex of two f32: real, then imaginary.
#[derive(Copy, Clone, Debug, Default, PartialEq)]
#[repr(C)]
pub struct Complex64 {
    pub re: f32,
    pub im: f32,
}

/// Complex of two f64: real, then imaginary.
#[derive(Copy, Clone, Debug, Default, PartialEq)]
#[repr(C)]
pub struct Complex128 {
    pub re: f64,
    pub im: f64,
}

impl Complex64 {
    pub fn new(re: f32, im: f32) -> Self {
        Complex64 { re, im }
    }
}

impl Complex128 {
    pub fn new(re: f64, im: f64) -> Self {
        Complex128 { re, im }
    }
}

/// A Rust type whose values are elements of one braid [`DType`].
///
/// # Safety
///
/// `Self` must have the size and alignment of `DTYPE`'s elements, no padding,
/// and every bit pattern of that size must be a valid `Self` (braid writes
/// whatever the other ranks hold).
pub unsafe trait Element: Copy + Send + Sync + 'static {
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => { $(unsafe impl Element for $t { const DTYPE: DType = DType::$d; })* };
}

element! {
    f64 => F64, f32 => F32, F16 => F16, BF16 => BF16, FP8E4M3 => FP8E4M3, FP8E5M2 => FP8E5M2,
    i64 => I64, i32 => I32, i16 => I16, i8 => I8, u64 => U64, u32 => U32, u16 => U16, u8 => U8,
    Bool => Bool, Complex64 => Complex64, Complex128 => Complex128,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_the_references() {
        let want = [
            (DType::F64, 0),
            (DType::F32, 1),
            (DType::F16, 2),
            (DType::BF16, 3),
            (DType::FP8E4M3, 4),
            (DType::FP8E5M2, 5),
            (DType::I64, 10),
            (DType::I32, 11),
            (DType::I16, 12),
            (DType::I8, 13),
            (DType::U64, 20),
            (DType::U32, 21),
            (DType::U16, 22),
            (DType::U8, 23),
            (DType::Bool, 30),
            (DType::Complex64, 40),
            (DType::Complex128, 41),
        ];
        for (d, c) in want {
            assert_eq!(d as u8 as i32, c);
            assert_eq!(DType::from_code(c), Some(d));
            // the library agrees on every size
            assert_eq!(unsafe { crate::ffi::braid_dtype_size(c) }, d.size_in_bytes(), "{}", d);
        }
        assert_eq!(DType::from_code(6), None);
    }

    #[test]
    fn element_sizes() {
        fn check<T: Element>() {
            assert_eq!(std::mem::size_of::<T>(), T::DTYPE.size_in_bytes(), "{}", T::DTYPE);
        }
        check::<f64>();
        check::<f32>();
        check::<F16>();
        check::<BF16>();
        check::<FP8E4M3>();
        check::<FP8E5M2>();
        check::<i64>();
        check::<i32>();
        check::<i16>();
        check::<i8>();
        check::<u64>();
        check::<u32>();
        check::<u16>();
        check::<u8>();
        check::<Bool>();
        check::<Complex64>();
        check::<Complex128>();
    }

    #[test]
    fn bf16_rounding() {
        assert_eq!(BF16::from_f32(1.0), BF16(0x3f80));
        assert_eq!(BF16::from_f32(3.0).to_f32(), 3.0);
        assert_eq!(BF16::from_f32(1.0 + 1.0 / 256.0), BF16(0x3f80)); // tie to even
        assert!(BF16::from_f32(f32::NAN).to_f32().is_nan());
    }
}
