//! The block object format (version 1): a header that checksums the data piece by piece, then
//! the data. Written once, never modified (S3 has no partial writes).
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `CLMB` |
//! | 4 | 1 | format version, 1 |
//! | 5 | 3 | reserved, 0 |
//! | 8 | 4 | data length in bytes (u32 le) |
//! | 12 | 4 | piece length in bytes, [`PIECE_BYTES`] (u32 le) |
//! | 16 | 4 × pieces | CRC-32 (IEEE) of each piece of the data; the last piece may be short |
//! | … | 4 | CRC-32 of every header byte before it |
//! | header end | data length | the data |
//!
//! The header's length follows from the data length, which the metadata records (the slice's
//! size), so a reader asks for the header and the pieces it needs in one request, and checks
//! every byte it returns: a corrupted or truncated object is an error, never file contents.

use bytes::{Bytes, BytesMut};

use crate::error::DataError;

/// Bytes checksummed together: a random read fetches and checks whole pieces.
pub const PIECE_BYTES: u32 = 64 << 10;
const MAGIC: &[u8; 4] = b"CLMB";
const VERSION: u8 = 1;
const FIXED: usize = 16;

/// Pieces of a block of `data_len` bytes.
pub fn pieces(data_len: u32) -> u32 {
    data_len.div_ceil(PIECE_BYTES)
}

/// Length of the header of a block of `data_len` bytes.
pub fn header_len(data_len: u32) -> u64 {
    (FIXED + 4 * pieces(data_len) as usize + 4) as u64
}

/// The header of the block object holding `data`.
pub fn header(data: &[u8]) -> Bytes {
    let data_len = u32::try_from(data.len()).expect("a block is smaller than 4 GiB");
    let mut out = BytesMut::with_capacity(header_len(data_len) as usize);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[VERSION, 0, 0, 0]);
    out.extend_from_slice(&data_len.to_le_bytes());
    out.extend_from_slice(&PIECE_BYTES.to_le_bytes());
    for piece in data.chunks(PIECE_BYTES as usize) {
        out.extend_from_slice(&crc32fast::hash(piece).to_le_bytes());
    }
    let header_crc = crc32fast::hash(&out);
    out.extend_from_slice(&header_crc.to_le_bytes());
    out.freeze()
}

/// The block object holding `data`: its [`header`], then the data.
pub fn encode(data: &[u8]) -> Bytes {
    let mut out = BytesMut::from(&header(data)[..]);
    out.extend_from_slice(data);
    out.freeze()
}

/// The byte range of the object to fetch for data bytes `[from, to)`: whole pieces.
pub fn data_range(data_len: u32, from: u32, to: u32) -> std::ops::Range<u64> {
    let first = from / PIECE_BYTES * PIECE_BYTES;
    let last = to
        .div_ceil(PIECE_BYTES)
        .saturating_mul(PIECE_BYTES)
        .min(data_len);
    let h = header_len(data_len);
    h + u64::from(first)..h + u64::from(last)
}

/// Checks a header and the whole pieces fetched for `[from, to)` (as [`data_range`] names
/// them), and returns the data bytes `[from, to)`.
pub fn verify(
    data_len: u32,
    header: &[u8],
    fetched: Bytes,
    from: u32,
    to: u32,
) -> Result<Bytes, DataError> {
    let corrupt = |why: String| Err(DataError::Corrupt(why));
    if header.len() as u64 != header_len(data_len) {
        return corrupt(format!("header of {} bytes", header.len()));
    }
    let (body, crc) = header.split_at(header.len() - 4);
    if crc32fast::hash(body).to_le_bytes() != crc {
        return corrupt("header checksum mismatch".into());
    }
    if &body[..4] != MAGIC || body[4] != VERSION {
        return corrupt("not a calm block (magic or version)".into());
    }
    let stored_len = u32::from_le_bytes(body[8..12].try_into().expect("4"));
    let piece = u32::from_le_bytes(body[12..16].try_into().expect("4"));
    if stored_len != data_len || piece != PIECE_BYTES {
        return corrupt(format!(
            "block of {stored_len} bytes in pieces of {piece}; the metadata says {data_len}"
        ));
    }
    let range = data_range(data_len, from, to);
    if fetched.len() as u64 != range.end - range.start {
        return corrupt(format!(
            "short block: {} bytes where {} were expected",
            fetched.len(),
            range.end - range.start
        ));
    }
    let first_piece = from / PIECE_BYTES;
    for (i, piece) in fetched.chunks(PIECE_BYTES as usize).enumerate() {
        let index = first_piece as usize + i;
        let at = FIXED + 4 * index;
        if crc32fast::hash(piece).to_le_bytes() != body[at..at + 4] {
            return corrupt(format!("checksum mismatch in piece {index}"));
        }
    }
    let skip = (from - first_piece * PIECE_BYTES) as usize;
    Ok(fetched.slice(skip..skip + (to - from) as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fetch(object: &Bytes, data_len: u32, from: u32, to: u32) -> (Bytes, Bytes) {
        let h = header_len(data_len) as usize;
        let r = data_range(data_len, from, to);
        (
            object.slice(..h),
            object.slice(r.start as usize..r.end as usize),
        )
    }

    #[test]
    fn any_range_reads_back_and_any_flipped_bit_is_caught() {
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let len = data.len() as u32;
        let object = encode(&data);
        for (from, to) in [(0, len), (1, 2), (65_535, 65_537), (131_072, len), (5, 5)] {
            let (header, body) = fetch(&object, len, from, to);
            let got = verify(len, &header, body, from, to).unwrap();
            assert_eq!(&got[..], &data[from as usize..to as usize]);
        }
        for flip in [3, 10, 20, header_len(len) as usize + 70_000] {
            let mut bad = object.to_vec();
            bad[flip] ^= 0x10;
            let bad = Bytes::from(bad);
            let (header, body) = fetch(&bad, len, 65_000, 140_000);
            assert!(
                matches!(
                    verify(len, &header, body, 65_000, 140_000),
                    Err(DataError::Corrupt(_))
                ),
                "byte {flip} flipped went unnoticed"
            );
        }
        // Truncated: the last piece comes back short.
        let short = object.slice(..object.len() - 10);
        let h = header_len(len) as usize;
        let r = data_range(len, 190_000, len);
        let body = short.slice(r.start as usize..short.len());
        assert!(verify(len, &short.slice(..h), body, 190_000, len).is_err());
        // The metadata's length disagrees with the block's.
        let (header, body) = fetch(&object, len, 0, 10);
        assert!(verify(len - 1, &header, body, 0, 10).is_err());
    }

    #[test]
    fn an_empty_block_has_a_header_only() {
        let object = encode(b"");
        assert_eq!(object.len() as u64, header_len(0));
        assert_eq!(
            verify(0, &object, Bytes::new(), 0, 0).unwrap(),
            Bytes::new()
        );
    }
}
