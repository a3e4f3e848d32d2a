// SPDX-License-Identifier: Apache-2.0
//! The servers' codec: prost's, except that a pushed batch arrives with the
//! frame it was decoded from.
//!
//! The aggregator's write-ahead log stores each accepted push as the
//! protobuf bytes of the request. Decoding with prost and encoding again for
//! the log would copy every payload once more; instead the decoder takes the
//! (decompressed) frame as one `Bytes` without copying, decodes the request
//! from it (payload fields are `Bytes` slices of that frame: see build.rs),
//! and hands both over.

use std::marker::PhantomData;

use prost::Message;
use prost::bytes::{Buf, Bytes};
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic_prost::ProstEncoder;

use crate::pb::PushRequest;

/// A pushed batch as the server received it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReceivedPush {
    pub request: PushRequest,
    /// The request's protobuf encoding as it came off the wire; the payloads
    /// in `request` share its memory.
    pub frame: Bytes,
}

/// A request type the servers decode from one frame.
pub trait FromFrame: Sized {
    fn from_frame(frame: Bytes) -> Result<Self, prost::DecodeError>;
}

impl<T: Message + Default> FromFrame for T {
    fn from_frame(frame: Bytes) -> Result<Self, prost::DecodeError> {
        T::decode(frame)
    }
}

impl FromFrame for ReceivedPush {
    fn from_frame(frame: Bytes) -> Result<Self, prost::DecodeError> {
        Ok(ReceivedPush { request: PushRequest::decode(frame.clone())?, frame })
    }
}

/// The codec every generated server uses (`codec_path` in build.rs).
#[derive(Debug, Clone)]
pub struct FrameCodec<E, D>(PhantomData<(E, D)>);

impl<E, D> Default for FrameCodec<E, D> {
    fn default() -> Self {
        FrameCodec(PhantomData)
    }
}

impl<E, D> Codec for FrameCodec<E, D>
where
    E: Message + Send + 'static,
    D: FromFrame + Send + 'static,
{
    type Encode = E;
    type Decode = D;
    type Encoder = ProstEncoder<E>;
    type Decoder = FrameDecoder<D>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        FrameDecoder(PhantomData)
    }
}

#[derive(Debug)]
pub struct FrameDecoder<D>(PhantomData<D>);

impl<D: FromFrame> Decoder for FrameDecoder<D> {
    type Item = D;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<D>, Status> {
        // DecodeBuf hands out its BytesMut's front without copying.
        let frame = buf.copy_to_bytes(buf.remaining());
        // As prost's codec does: a malformed message is INTERNAL (gRPC spec).
        D::from_frame(frame).map(Some).map_err(|e| Status::internal(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::TableBatch;

    fn push() -> PushRequest {
        PushRequest {
            node: "gpu-7".into(),
            sequence: 42,
            tables: vec![TableBatch { table: "cuda_ops".into(), arrow_ipc: Bytes::from(vec![7u8; 4096]) }],
        }
    }

    #[test]
    fn a_push_keeps_its_frame_and_its_payload_shares_the_frame() {
        let frame = Bytes::from(push().encode_to_vec());
        let got = ReceivedPush::from_frame(frame.clone()).unwrap();
        assert_eq!(got.request, push());
        assert_eq!(got.frame, frame);
        let span = frame.as_ptr_range();
        let payload = got.request.tables[0].arrow_ipc.as_ptr_range();
        assert!(span.start <= payload.start && payload.end <= span.end, "payload was copied out of the frame");
    }

    #[test]
    fn other_requests_decode_as_prost_decodes_them() {
        let req = crate::pb::ForwardRequest { from: "a".into(), signals_json: "[]".into(), standby: true };
        let frame = Bytes::from(req.encode_to_vec());
        assert_eq!(crate::pb::ForwardRequest::from_frame(frame).unwrap(), req);
    }

    #[test]
    fn a_malformed_push_is_refused() {
        assert!(ReceivedPush::from_frame(Bytes::from_static(&[0x1a, 0xff])).is_err());
    }
}
