//! TensorBoard event files, written by hand: the TFRecord framing and the few protobuf fields
//! of a scalar `Event`.
//!
//! Each record is
//!
//! ```text
//! u64 LE   length of data
//! u32 LE   masked_crc32c(length bytes)
//! [u8]     data: one serialized tensorflow.Event
//! u32 LE   masked_crc32c(data)
//! ```
//!
//! with `masked_crc32c(x) = ((c >> 15) | (c << 17)) + 0xa282ead8` over the Castagnoli CRC `c`.
//! The first record is `Event { wall_time, file_version: "brain.Event:2" }`; each logged step is
//! `Event { wall_time (1, double), step (2, int64), summary (5) }` with
//! `Summary { value (1, repeated): Value { tag (1, string), simple_value (2, float) } }`, the
//! encoding TensorBoard's `EventAccumulator` reads as scalars.

use std::fs::{File, OpenOptions};
use std::io::{Seek, Write};
use std::path::{Path, PathBuf};

use crate::error::{TrainerError, io_err};

/// The event file's name inside the run directory (TensorBoard looks for `tfevents` in it).
pub const EVENTS_FILE: &str = "events.out.tfevents.flowrl";

const FILE_VERSION: &str = "brain.Event:2";

const fn crc32c_table() -> [u32; 256] {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0x82F6_3B78
            } else {
                c >> 1
            };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
}

static CRC32C: [u32; 256] = crc32c_table();

/// CRC-32C (Castagnoli, reflected polynomial `0x82F63B78`).
///
/// ```
/// assert_eq!(trainer_fsdp::crc32c(b"123456789"), 0xE306_9283);
/// ```
pub fn crc32c(bytes: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in bytes {
        c = CRC32C[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

/// TFRecord's masked CRC.
pub fn masked_crc32c(bytes: &[u8]) -> u32 {
    let c = crc32c(bytes);
    c.rotate_right(15).wrapping_add(0xa282_ead8)
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn key(out: &mut Vec<u8>, field: u64, wire: u64) {
    varint(out, (field << 3) | wire);
}

fn bytes_field(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    key(out, field, 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// One decoded event.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Seconds since the Unix epoch.
    pub wall_time: f64,
    /// The step (0 for the file-version record).
    pub step: i64,
    /// `Some` for the first record of a file.
    pub file_version: Option<String>,
    /// `(tag, simple_value)` of every summary value.
    pub scalars: Vec<(String, f32)>,
}

/// Serializes one `tensorflow.Event` (only the fields above, fields in number order).
pub fn encode_event(event: &Event) -> Vec<u8> {
    let mut out = Vec::new();
    key(&mut out, 1, 1);
    out.extend_from_slice(&event.wall_time.to_le_bytes());
    if event.step != 0 {
        key(&mut out, 2, 0);
        varint(&mut out, event.step as u64);
    }
    if let Some(v) = &event.file_version {
        bytes_field(&mut out, 3, v.as_bytes());
    }
    if !event.scalars.is_empty() {
        let mut summary = Vec::new();
        for (tag, value) in &event.scalars {
            let mut v = Vec::new();
            bytes_field(&mut v, 1, tag.as_bytes());
            key(&mut v, 2, 5);
            v.extend_from_slice(&value.to_le_bytes());
            bytes_field(&mut summary, 1, &v);
        }
        bytes_field(&mut out, 5, &summary);
    }
    out
}

fn frame(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc32c(data).to_le_bytes());
    out
}

/// An append-only event file.
#[derive(Debug)]
pub struct EventWriter {
    path: PathBuf,
    file: File,
    len: u64,
}

impl EventWriter {
    /// Opens `path` after truncating it to `keep_bytes` (0: a fresh file, which starts with the
    /// file-version record stamped `wall_time`).
    ///
    /// # Errors
    /// [`TrainerError::Io`].
    pub fn open(path: &Path, keep_bytes: u64, wall_time: f64) -> Result<Self, TrainerError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(io_err(parent, "create directory"))?;
        }
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path)
            .map_err(io_err(path, "open"))?;
        let len = file
            .metadata()
            .map_err(io_err(path, "stat"))?
            .len()
            .min(keep_bytes);
        file.set_len(len).map_err(io_err(path, "truncate"))?;
        file.seek(std::io::SeekFrom::Start(len))
            .map_err(io_err(path, "seek"))?;
        let mut w = Self {
            path: path.to_path_buf(),
            file,
            len,
        };
        if len == 0 {
            w.write_event(&Event {
                wall_time,
                step: 0,
                file_version: Some(FILE_VERSION.into()),
                scalars: Vec::new(),
            })?;
        }
        Ok(w)
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the file holds nothing (never true after `open`).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends one framed event and flushes.
    ///
    /// # Errors
    /// [`TrainerError::Io`].
    pub fn write_event(&mut self, event: &Event) -> Result<(), TrainerError> {
        let rec = frame(&encode_event(event));
        durable::crash_point("append to", &self.path);
        self.file
            .write_all(&rec)
            .and_then(|()| self.file.flush())
            .map_err(io_err(&self.path, "append to"))?;
        self.len += rec.len() as u64;
        Ok(())
    }

    /// Appends one event with every `(tag, value)` of a step as `simple_value` scalars (values
    /// rounded to `f32`, TensorBoard's scalar type).
    ///
    /// # Errors
    /// [`TrainerError::Io`].
    pub fn write_scalars<'a>(
        &mut self,
        step: u64,
        wall_time: f64,
        values: impl IntoIterator<Item = (&'a str, f64)>,
    ) -> Result<(), TrainerError> {
        self.write_event(&Event {
            wall_time,
            step: step as i64,
            file_version: None,
            scalars: values
                .into_iter()
                .map(|(t, v)| (t.to_string(), v as f32))
                .collect(),
        })
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.b.get(self.at)?;
            self.at += 1;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let s = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    fn done(&self) -> bool {
        self.at >= self.b.len()
    }
    /// Skips a field of wire type `wire`.
    fn skip(&mut self, wire: u64) -> Option<()> {
        match wire {
            0 => self.varint().map(|_| ()),
            1 => self.take(8).map(|_| ()),
            2 => {
                let n = self.varint()? as usize;
                self.take(n).map(|_| ())
            }
            5 => self.take(4).map(|_| ()),
            _ => None,
        }
    }
}

fn decode_value(b: &[u8]) -> Option<Option<(String, f32)>> {
    let mut r = Reader { b, at: 0 };
    let (mut tag, mut value) = (None, None);
    while !r.done() {
        let k = r.varint()?;
        match (k >> 3, k & 7) {
            (1, 2) => {
                let n = r.varint()? as usize;
                tag = Some(String::from_utf8(r.take(n)?.to_vec()).ok()?);
            }
            (2, 5) => value = Some(f32::from_le_bytes(r.take(4)?.try_into().ok()?)),
            (_, wire) => r.skip(wire)?,
        }
    }
    Some(tag.zip(value))
}

fn decode_event(b: &[u8]) -> Option<Event> {
    let mut r = Reader { b, at: 0 };
    let mut e = Event {
        wall_time: 0.0,
        step: 0,
        file_version: None,
        scalars: Vec::new(),
    };
    while !r.done() {
        let k = r.varint()?;
        match (k >> 3, k & 7) {
            (1, 1) => e.wall_time = f64::from_le_bytes(r.take(8)?.try_into().ok()?),
            (2, 0) => e.step = r.varint()? as i64,
            (3, 2) => {
                let n = r.varint()? as usize;
                e.file_version = Some(String::from_utf8(r.take(n)?.to_vec()).ok()?);
            }
            (5, 2) => {
                let n = r.varint()? as usize;
                let mut s = Reader {
                    b: r.take(n)?,
                    at: 0,
                };
                while !s.done() {
                    let k = s.varint()?;
                    match (k >> 3, k & 7) {
                        (1, 2) => {
                            let n = s.varint()? as usize;
                            if let Some(v) = decode_value(s.take(n)?)? {
                                e.scalars.push(v);
                            }
                        }
                        (_, wire) => s.skip(wire)?,
                    }
                }
            }
            (_, wire) => r.skip(wire)?,
        }
    }
    Some(e)
}

/// Reads every event of a file, checking both CRCs of every record.
///
/// # Errors
/// [`TrainerError::Io`], [`TrainerError::EventFile`] naming the damaged record's offset.
pub fn read_events(path: &Path) -> Result<Vec<Event>, TrainerError> {
    let bytes = std::fs::read(path).map_err(io_err(path, "read"))?;
    parse_events(&bytes, path)
}

/// Parses the bytes of an event file (`path` names it in errors), checking both CRCs of
/// every record; the bytes must end at a record boundary.
///
/// # Errors
/// [`TrainerError::EventFile`] naming the damaged record's offset.
pub fn parse_events(bytes: &[u8], path: &Path) -> Result<Vec<Event>, TrainerError> {
    let mut out = Vec::new();
    let mut at = 0usize;
    let bad = |offset: usize, problem| TrainerError::EventFile {
        path: path.to_path_buf(),
        offset: offset as u64,
        problem,
    };
    while at < bytes.len() {
        let header = bytes
            .get(at..at + 12)
            .ok_or_else(|| bad(at, "truncated record header"))?;
        let len_bytes = &header[..8];
        let len_crc = u32::from_le_bytes(header[8..12].try_into().expect("4 bytes"));
        if masked_crc32c(len_bytes) != len_crc {
            return Err(bad(at, "length CRC mismatch"));
        }
        let len = u64::from_le_bytes(len_bytes.try_into().expect("8 bytes")) as usize;
        let data = bytes
            .get(at + 12..at + 12 + len)
            .ok_or_else(|| bad(at, "truncated record data"))?;
        let crc = bytes
            .get(at + 12 + len..at + 16 + len)
            .ok_or_else(|| bad(at, "truncated data CRC"))?;
        if masked_crc32c(data) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
            return Err(bad(at, "data CRC mismatch"));
        }
        out.push(decode_event(data).ok_or_else(|| bad(at, "not a tensorflow.Event"))?);
        at += 16 + len;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_known_vectors() {
        // RFC 3720 (iSCSI) test vectors
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62A8_AB43);
        let inc: Vec<u8> = (0..32).collect();
        assert_eq!(crc32c(&inc), 0x46DD_794E);
        assert_eq!(crc32c(b""), 0);
    }

    #[test]
    fn event_encoding_is_the_protobuf_wire_format() {
        let e = Event {
            wall_time: 1.0,
            step: 300,
            file_version: None,
            scalars: vec![("a".into(), 0.5)],
        };
        let bytes = encode_event(&e);
        #[rustfmt::skip]
        let expect: Vec<u8> = [
            &[0x09][..], &1.0f64.to_le_bytes(),        // wall_time, fixed64
            &[0x10, 0xac, 0x02],                        // step 300, varint
            &[0x2a, 0x0a],                              // summary, 10 bytes
            &[0x0a, 0x08],                              //   value, 8 bytes
            &[0x0a, 0x01, b'a'],                        //     tag "a"
            &[0x15], &0.5f32.to_le_bytes(),             //     simple_value, fixed32
        ]
        .concat();
        assert_eq!(bytes, expect);
        assert_eq!(decode_event(&bytes).unwrap(), e);
    }

    #[test]
    fn write_read_resume_and_detect_damage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(EVENTS_FILE);
        let mut w = EventWriter::open(&path, 0, 100.0).unwrap();
        w.write_scalars(1, 101.0, [("train/loss", 0.25), ("train/lr", 3e-4)])
            .unwrap();
        let cursor = w.len();
        w.write_scalars(2, 102.0, [("train/loss", 0.125)]).unwrap();
        drop(w);
        let events = read_events(&path).unwrap();
        assert_eq!(events.len(), 3);
        assert_eq!(events[0].file_version.as_deref(), Some("brain.Event:2"));
        assert_eq!(events[0].wall_time, 100.0);
        assert_eq!(
            events[1].scalars,
            vec![
                ("train/loss".to_string(), 0.25),
                ("train/lr".into(), 3e-4f32)
            ]
        );
        assert_eq!(events[2].step, 2);

        // resume at the cursor: step 2 is dropped and no second header is written
        let mut w = EventWriter::open(&path, cursor, 200.0).unwrap();
        w.write_scalars(2, 202.0, [("train/loss", 0.5)]).unwrap();
        let events = read_events(&path).unwrap();
        assert_eq!(events.len(), 3);
        assert_eq!(events[2].wall_time, 202.0);
        assert_eq!(events[2].scalars[0].1, 0.5);

        // flip one payload byte: the data CRC catches it
        let mut bytes = std::fs::read(&path).unwrap();
        let n = bytes.len();
        bytes[n - 6] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        let err = read_events(&path).unwrap_err();
        assert!(err.to_string().contains("data CRC mismatch"), "{err}");
        // cut the file mid-record
        std::fs::write(&path, &bytes[..n - 3]).unwrap();
        assert!(
            read_events(&path)
                .unwrap_err()
                .to_string()
                .contains("truncated")
        );
    }

    /// The checked-in event file was written by this writer
    /// (`fixtures/trainer_fsdp/tensorboard/events.out.tfevents.flowrl`) and read by TensorBoard's own
    /// `EventAccumulator` (`fixtures/generate/trainer_tensorboard_read.py`, tensorboard 2.21.0), whose
    /// scalars are recorded in `fixtures/trainer_fsdp/tensorboard/expected_scalars.json`. This test
    /// regenerates the file from the same inputs and requires the same bytes, then checks the
    /// scalars TensorBoard read.
    #[test]
    fn tensorboard_reads_what_we_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(EVENTS_FILE);
        fixture_events(&path);
        let ours = std::fs::read(&path).unwrap();
        let theirs = include_bytes!(
            "../../../../fixtures/trainer_fsdp/tensorboard/events.out.tfevents.flowrl"
        );
        assert_eq!(
            ours.as_slice(),
            theirs.as_slice(),
            "the writer's bytes changed"
        );

        #[derive(serde::Deserialize)]
        struct Scalar {
            step: i64,
            value: f32,
            wall_time: f64,
        }
        let expected: std::collections::BTreeMap<String, Vec<Scalar>> = serde_json::from_str(
            include_str!("../../../../fixtures/trainer_fsdp/tensorboard/expected_scalars.json"),
        )
        .unwrap();
        let events = read_events(&path).unwrap();
        assert_eq!(expected.len(), 3);
        for (tag, scalars) in &expected {
            let ours: Vec<(i64, f32, f64)> = events
                .iter()
                .flat_map(|e| {
                    e.scalars
                        .iter()
                        .filter(|(t, _)| t == tag)
                        .map(|(_, v)| (e.step, *v, e.wall_time))
                })
                .collect();
            let theirs: Vec<(i64, f32, f64)> = scalars
                .iter()
                .map(|s| (s.step, s.value, s.wall_time))
                .collect();
            assert_eq!(ours, theirs, "{tag}");
        }
    }

    /// The inputs of the TensorBoard fixture.
    pub(crate) fn fixture_events(path: &Path) {
        let mut w = EventWriter::open(path, 0, 1_700_000_000.0).unwrap();
        for step in 0..4u64 {
            let s = step as f64;
            w.write_scalars(
                step,
                1_700_000_000.0 + s,
                [
                    ("train/loss", 0.5 - 0.125 * s),
                    ("reward/pickscore_mean", 0.25 + 0.0625 * s),
                    ("train/lr", 3e-4),
                ],
            )
            .unwrap();
        }
    }

    /// Writes the fixture file: `FLOWRL_WRITE_TB_FIXTURE=<dir> cargo test -p trainer-fsdp
    /// write_tensorboard_fixture` (then run `fixtures/generate/trainer_tensorboard_read.py`).
    #[test]
    fn write_tensorboard_fixture() {
        let Some(dir) = std::env::var_os("FLOWRL_WRITE_TB_FIXTURE") else {
            // not asked to regenerate: check the fixture exists and parses instead
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("f");
            std::fs::write(
                &p,
                include_bytes!(
                    "../../../../fixtures/trainer_fsdp/tensorboard/events.out.tfevents.flowrl"
                ),
            )
            .unwrap();
            assert_eq!(read_events(&p).unwrap().len(), 5);
            return;
        };
        fixture_events(&Path::new(&dir).join(EVENTS_FILE));
    }
}
