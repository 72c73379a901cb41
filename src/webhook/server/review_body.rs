//! A review's body, read within the size limit; of one over it, only the first bytes (to
//! find its uid for the answer).

use axum::body::{Body, Bytes};
use bytes::BytesMut;
use http_body_util::BodyExt;

/// Bytes of an over-limit body kept to find its uid.
const PREFIX_BYTES: usize = 64 << 10;

/// Why a review's body was not read.
pub(super) enum ReadError {
    /// Over the limit: the first bytes (for the uid) and the size, if it was read to the end.
    TooLarge {
        prefix: Vec<u8>,
        size: Option<usize>,
    },
    Broken(String),
}

/// Reads a body of at most `limit` bytes. A larger one is read on (and dropped) up to four
/// times the limit, so the client gets the answer rather than a reset connection; only its
/// first `PREFIX_BYTES` are kept.
pub(super) async fn read_body(
    mut body: Body,
    length: Option<usize>,
    limit: usize,
) -> Result<Bytes, ReadError> {
    let mut over = length.is_some_and(|length| length > limit);
    let mut buffer = BytesMut::with_capacity(if over { PREFIX_BYTES } else { length.unwrap_or(0) });
    let mut total = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|error| ReadError::Broken(error.to_string()))?;
        let Ok(data) = frame.into_data() else { continue };
        total += data.len();
        if total > limit && !over {
            over = true;
            buffer.truncate(PREFIX_BYTES);
        }
        if !over {
            buffer.extend_from_slice(&data);
        } else if buffer.len() < PREFIX_BYTES {
            let room = PREFIX_BYTES - buffer.len();
            buffer.extend_from_slice(&data[..room.min(data.len())]);
        }
        if total > limit.saturating_mul(4) {
            return Err(ReadError::TooLarge {
                prefix: buffer.to_vec(),
                size: None,
            });
        }
    }
    if over {
        return Err(ReadError::TooLarge {
            prefix: buffer.to_vec(),
            size: Some(total),
        });
    }
    Ok(buffer.freeze())
}
