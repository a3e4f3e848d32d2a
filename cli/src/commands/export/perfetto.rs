// SPDX-License-Identifier: Apache-2.0
//! Perfetto's trace format (protos/perfetto/trace/trace_packet.proto,
//! track_event/*.proto): the few messages a track-event trace needs, with
//! Perfetto's field numbers, and a builder for nested tracks, slices and
//! counters. The test decodes the output with Perfetto's own published
//! protos (PyPI `perfetto`), so a wrong number here fails it.

use prost::Message;

#[derive(Clone, PartialEq, Message)]
pub(crate) struct Trace {
    #[prost(message, repeated, tag = "1")]
    pub packet: Vec<TracePacket>,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct TracePacket {
    #[prost(uint64, optional, tag = "8")]
    pub timestamp: Option<u64>,
    #[prost(uint32, optional, tag = "10")]
    pub trusted_packet_sequence_id: Option<u32>,
    #[prost(message, optional, tag = "11")]
    pub track_event: Option<TrackEvent>,
    #[prost(message, optional, tag = "60")]
    pub track_descriptor: Option<TrackDescriptor>,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct TrackDescriptor {
    #[prost(uint64, optional, tag = "1")]
    pub uuid: Option<u64>,
    #[prost(string, optional, tag = "2")]
    pub name: Option<String>,
    #[prost(uint64, optional, tag = "5")]
    pub parent_uuid: Option<u64>,
    #[prost(message, optional, tag = "8")]
    pub counter: Option<CounterDescriptor>,
    /// Perfetto's ChildTracksOrdering: 1 lexicographic, 3 explicit.
    #[prost(int32, optional, tag = "11")]
    pub child_ordering: Option<i32>,
    #[prost(int32, optional, tag = "12")]
    pub sibling_order_rank: Option<i32>,
    #[prost(string, optional, tag = "14")]
    pub description: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct CounterDescriptor {
    #[prost(string, optional, tag = "6")]
    pub unit_name: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct TrackEvent {
    #[prost(message, repeated, tag = "4")]
    pub debug_annotations: Vec<DebugAnnotation>,
    /// 1 slice begin, 2 slice end, 3 instant, 4 counter.
    #[prost(int32, optional, tag = "9")]
    pub r#type: Option<i32>,
    #[prost(uint64, optional, tag = "11")]
    pub track_uuid: Option<u64>,
    #[prost(string, repeated, tag = "22")]
    pub categories: Vec<String>,
    #[prost(string, optional, tag = "23")]
    pub name: Option<String>,
    #[prost(double, optional, tag = "44")]
    pub double_counter_value: Option<f64>,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct DebugAnnotation {
    #[prost(int64, optional, tag = "4")]
    pub int_value: Option<i64>,
    #[prost(double, optional, tag = "5")]
    pub double_value: Option<f64>,
    #[prost(string, optional, tag = "6")]
    pub string_value: Option<String>,
    #[prost(string, optional, tag = "10")]
    pub name: Option<String>,
}

const SLICE_BEGIN: i32 = 1;
const SLICE_END: i32 = 2;
const INSTANT: i32 = 3;
const COUNTER: i32 = 4;
const LEXICOGRAPHIC: i32 = 1;
/// One writer: every packet on one sequence.
const SEQUENCE: u32 = 1;

/// A debug annotation shown in the slice's details.
pub(crate) fn arg(name: &str, v: impl Into<ArgValue>) -> DebugAnnotation {
    let mut a = DebugAnnotation { name: Some(name.into()), ..Default::default() };
    match v.into() {
        ArgValue::Int(i) => a.int_value = Some(i),
        ArgValue::Float(f) => a.double_value = Some(f),
        ArgValue::Text(s) => a.string_value = Some(s),
    }
    a
}

#[derive(Debug)]
pub(crate) enum ArgValue {
    Int(i64),
    Float(f64),
    Text(String),
}

impl From<i64> for ArgValue {
    fn from(v: i64) -> Self {
        ArgValue::Int(v)
    }
}
impl From<f64> for ArgValue {
    fn from(v: f64) -> Self {
        ArgValue::Float(v)
    }
}
impl From<&str> for ArgValue {
    fn from(v: &str) -> Self {
        ArgValue::Text(v.to_string())
    }
}
impl From<String> for ArgValue {
    fn from(v: String) -> Self {
        ArgValue::Text(v)
    }
}

/// A slice to place on a track: [start, end) in ns.
#[derive(Debug)]
pub(crate) struct Slice {
    pub start_ns: u64,
    pub end_ns: u64,
    pub name: String,
    pub category: String,
    pub args: Vec<DebugAnnotation>,
}

/// Builds a trace: descriptors first, then events in time order per track.
#[derive(Debug, Default)]
pub(crate) struct Builder {
    packets: Vec<TracePacket>,
    next_uuid: u64,
}

impl Builder {
    /// A track (a group when others name it as parent); returns its uuid.
    pub(crate) fn track(&mut self, parent: Option<u64>, name: &str, description: Option<String>) -> u64 {
        self.descriptor(TrackDescriptor {
            parent_uuid: parent,
            name: Some(name.into()),
            description,
            child_ordering: Some(LEXICOGRAPHIC),
            ..Default::default()
        })
    }

    /// A counter track under `parent`, in `unit`.
    pub(crate) fn counter_track(&mut self, parent: u64, name: &str, unit: &str) -> u64 {
        self.descriptor(TrackDescriptor {
            parent_uuid: Some(parent),
            name: Some(name.into()),
            counter: Some(CounterDescriptor { unit_name: Some(unit.into()) }),
            ..Default::default()
        })
    }

    fn descriptor(&mut self, mut d: TrackDescriptor) -> u64 {
        self.next_uuid += 1;
        let uuid = self.next_uuid;
        d.uuid = Some(uuid);
        d.sibling_order_rank = Some(uuid as i32);
        self.packets.push(TracePacket {
            trusted_packet_sequence_id: Some(SEQUENCE),
            track_descriptor: Some(d),
            ..Default::default()
        });
        uuid
    }

    fn event(&mut self, ts: u64, e: TrackEvent) {
        self.packets.push(TracePacket {
            timestamp: Some(ts),
            trusted_packet_sequence_id: Some(SEQUENCE),
            track_event: Some(e),
            ..Default::default()
        });
    }

    pub(crate) fn counter(&mut self, track: u64, ts: u64, value: f64) {
        let e = TrackEvent {
            r#type: Some(COUNTER),
            track_uuid: Some(track),
            double_counter_value: Some(value),
            ..Default::default()
        };
        self.event(ts, e);
    }

    /// Slices of one track. A track shows slices as a stack, so a slice that
    /// starts inside another is cut to end with it (a call made from inside
    /// another nests; overlap any other way would misdraw both).
    pub(crate) fn slices(&mut self, track: u64, mut slices: Vec<Slice>) {
        slices.sort_by_key(|s| (s.start_ns, std::cmp::Reverse(s.end_ns)));
        let mut open: Vec<u64> = Vec::new();
        for s in slices {
            while open.last().is_some_and(|&end| end <= s.start_ns) {
                let end = open.pop().unwrap_or_default();
                self.end(track, end);
            }
            let end = open.last().map_or(s.end_ns, |&outer| s.end_ns.min(outer)).max(s.start_ns);
            let e = TrackEvent {
                r#type: Some(SLICE_BEGIN),
                track_uuid: Some(track),
                name: Some(s.name),
                categories: vec![s.category],
                debug_annotations: s.args,
                ..Default::default()
            };
            self.event(s.start_ns, e);
            open.push(end);
        }
        while let Some(end) = open.pop() {
            self.end(track, end);
        }
    }

    /// A mark at one instant (a zero-length event Perfetto draws as an arrow).
    pub(crate) fn instant(&mut self, track: u64, ts: u64, name: String, category: &str, args: Vec<DebugAnnotation>) {
        let e = TrackEvent {
            r#type: Some(INSTANT),
            track_uuid: Some(track),
            name: Some(name),
            categories: vec![category.into()],
            debug_annotations: args,
            ..Default::default()
        };
        self.event(ts, e);
    }

    fn end(&mut self, track: u64, ts: u64) {
        self.event(ts, TrackEvent { r#type: Some(SLICE_END), track_uuid: Some(track), ..Default::default() });
    }

    pub(crate) fn encode(self) -> Vec<u8> {
        Trace { packet: self.packets }.encode_to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(start: u64, end: u64) -> Slice {
        Slice { start_ns: start, end_ns: end, name: format!("{start}"), category: "c".into(), args: vec![] }
    }

    /// (type, ts) of every event, in file order.
    fn events(b: Builder) -> Vec<(i32, u64)> {
        let t = Trace::decode(b.encode().as_slice()).unwrap();
        t.packet.iter().filter_map(|p| Some((p.track_event.as_ref()?.r#type?, p.timestamp?))).collect()
    }

    #[test]
    fn slices_nest_and_overlaps_are_cut_to_their_outer_slice() {
        let mut b = Builder::default();
        let t = b.track(None, "thread", None);
        // 0..100 holds 10..20 (nested) and 90..150 (overlaps its end: cut to 100); 200..210 after.
        b.slices(t, vec![slice(200, 210), slice(90, 150), slice(0, 100), slice(10, 20)]);
        let (begin, end) = (SLICE_BEGIN, SLICE_END);
        assert_eq!(
            events(b),
            vec![(begin, 0), (begin, 10), (end, 20), (begin, 90), (end, 100), (end, 100), (begin, 200), (end, 210)]
        );
    }

    #[test]
    fn tracks_get_unique_uuids_and_parents() {
        let mut b = Builder::default();
        let node = b.track(None, "node-1", Some("clock".into()));
        let proc_ = b.track(Some(node), "python3", None);
        let c = b.counter_track(proc_, "run-queue wait", "%");
        b.counter(c, 5, 12.5);
        let t = Trace::decode(b.encode().as_slice()).unwrap();
        let d: Vec<&TrackDescriptor> = t.packet.iter().filter_map(|p| p.track_descriptor.as_ref()).collect();
        assert_eq!(d.iter().map(|d| d.uuid.unwrap()).collect::<Vec<_>>(), vec![node, proc_, c]);
        assert_eq!((d[1].parent_uuid, d[2].parent_uuid), (Some(node), Some(proc_)));
        assert_eq!(d[2].counter.as_ref().unwrap().unit_name.as_deref(), Some("%"));
        let last = t.packet.last().unwrap().track_event.as_ref().unwrap();
        assert_eq!((last.r#type, last.double_counter_value), (Some(COUNTER), Some(12.5)));
    }
}
