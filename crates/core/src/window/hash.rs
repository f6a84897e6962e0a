//! The stable 64-bit hash every window key is built from: FNV-1a over bytes, finished with a 64-bit
//! mix, the same on every machine and every run (a leaf, so `keys`, the window's root and the
//! decoder's duplicate-`doc_id` check share it).

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
