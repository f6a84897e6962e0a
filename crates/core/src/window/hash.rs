//! The stable 64-bit hash every window key is built from: FNV-1a over bytes, finished with a 64-bit
//! mix, the same on every machine and every run (a leaf, so `keys` and the window's root share it);
//! and a faster one for tables that live only in memory (the decoder's duplicate-`doc_id` check).

pub(crate) const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
pub(crate) const FNV_PRIME: u64 = 0x0100_0000_01b3;

/// FNV-1a of `bytes`, continued from the state `h`.
pub(crate) fn fnv(mut h: u64, bytes: impl IntoIterator<Item = u8>) -> u64 {
    for b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

/// A 64-bit finaliser, so nearby FNV states spread over the whole range.
pub(crate) fn mix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

/// A hash of `bytes` for tables that live only in memory (the decoder's duplicate-`doc_id` check,
/// where equal hashes are then compared as text): ids up to 16 bytes (nearly all) take two
/// overlapping loads that cover every byte and one folded multiply, where `fnv` takes a multiply
/// per byte; longer ones one multiply per eight bytes. Not a key hash: nothing persists it.
#[inline]
pub(crate) fn words(bytes: &[u8]) -> u64 {
    const P0: u64 = 0xa076_1d64_78bd_642f;
    const P1: u64 = 0xe703_7ed1_a0b4_28db;
    // The 128-bit product's halves xor-ed: every input bit reaches the low bits the table indexes by.
    let fold = |a: u64, b: u64| {
        let m = u128::from(a) * u128::from(b);
        (m as u64) ^ ((m >> 64) as u64)
    };
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let u32_at = |at: usize| u64::from(u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")));
    let n = bytes.len();
    let (mut seed, a, b) = (P0 ^ n as u64, 0u64, 0u64);
    let (a, b) = match n {
        0 => (a, b),
        1..=3 => ((u64::from(bytes[0]) << 16) | (u64::from(bytes[n / 2]) << 8) | u64::from(bytes[n - 1]), b),
        4..=7 => (u32_at(0), u32_at(n - 4)),
        8..=16 => (u64_at(0), u64_at(n - 8)),
        _ => {
            let mut at = 0;
            while at + 16 < n {
                seed = fold(u64_at(at) ^ P1, u64_at(at + 8) ^ seed);
                at += 16;
            }
            (u64_at(n - 16), u64_at(n - 8))
        }
    };
    fold(a ^ P1, b ^ seed)
}
