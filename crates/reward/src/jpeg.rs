//! JPEG compressibility and incompressibility, as DDPO defines them (Black et al. 2023,
//! `ddpo_pytorch/rewards.py`): the image is saved by Pillow as a baseline JPEG at quality 95
//! and the reward is the file size in kilobytes (`bytes / 1000`), negated for
//! compressibility.
//!
//! The size depends on the encoder, so this module carries its own baseline encoder written to
//! produce the stream Pillow's libjpeg(-turbo) writes with Pillow's defaults: JFIF header, the
//! IJG quality scaling of the Annex K tables, 4:2:0 chroma subsampling (libjpeg's `h2v2`
//! averaging with its alternating rounding bias), libjpeg's fixed-point RGB -> YCbCr, the
//! `islow` integer DCT, the standard Huffman tables (no optimisation), libjpeg's edge
//! replication and dummy blocks. Its output size is checked against Pillow's in
//! `tests/jpeg.rs` on the fixture images.

use crate::error::RewardError;
use crate::image::RgbImage;
use crate::scorer::{Batch, Components, Input, Scorer};

/// DDPO's JPEG quality.
pub const DDPO_QUALITY: u8 = 95;

/// Component name of [`JpegScorer`] in [`JpegReward::Incompressibility`] mode.
pub const INCOMPRESSIBILITY: &str = "jpeg_incompressibility";
/// Component name of [`JpegScorer`] in [`JpegReward::Compressibility`] mode.
pub const COMPRESSIBILITY: &str = "jpeg_compressibility";

const NATURAL_ORDER: [usize; 64] = [
    0, 1, 8, 16, 9, 2, 3, 10, 17, 24, 32, 25, 18, 11, 4, 5, 12, 19, 26, 33, 40, 48, 41, 34, 27, 20,
    13, 6, 7, 14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51, 58, 59,
    52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63,
];

// ITU T.81 Annex K.1, natural (row-major) order.
const STD_LUMA_Q: [u32; 64] = [
    16, 11, 10, 16, 24, 40, 51, 61, 12, 12, 14, 19, 26, 58, 60, 55, 14, 13, 16, 24, 40, 57, 69, 56,
    14, 17, 22, 29, 51, 87, 80, 62, 18, 22, 37, 56, 68, 109, 103, 77, 24, 35, 55, 64, 81, 104, 113,
    92, 49, 64, 78, 87, 103, 121, 120, 101, 72, 92, 95, 98, 112, 100, 103, 99,
];
const STD_CHROMA_Q: [u32; 64] = [
    17, 18, 24, 47, 99, 99, 99, 99, 18, 21, 26, 66, 99, 99, 99, 99, 24, 26, 56, 99, 99, 99, 99, 99,
    47, 66, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99,
    99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99,
];

// ITU T.81 Annex K.3: code-length counts (1..16) and symbols.
const DC_LUMA_BITS: [u8; 16] = [0, 1, 5, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0];
const DC_LUMA_VALS: [u8; 12] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11];
const DC_CHROMA_BITS: [u8; 16] = [0, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0];
const DC_CHROMA_VALS: [u8; 12] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11];
const AC_LUMA_BITS: [u8; 16] = [0, 2, 1, 3, 3, 2, 4, 3, 5, 5, 4, 4, 0, 0, 1, 0x7d];
const AC_LUMA_VALS: [u8; 162] = [
    0x01, 0x02, 0x03, 0x00, 0x04, 0x11, 0x05, 0x12, 0x21, 0x31, 0x41, 0x06, 0x13, 0x51, 0x61, 0x07,
    0x22, 0x71, 0x14, 0x32, 0x81, 0x91, 0xa1, 0x08, 0x23, 0x42, 0xb1, 0xc1, 0x15, 0x52, 0xd1, 0xf0,
    0x24, 0x33, 0x62, 0x72, 0x82, 0x09, 0x0a, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x25, 0x26, 0x27, 0x28,
    0x29, 0x2a, 0x34, 0x35, 0x36, 0x37, 0x38, 0x39, 0x3a, 0x43, 0x44, 0x45, 0x46, 0x47, 0x48, 0x49,
    0x4a, 0x53, 0x54, 0x55, 0x56, 0x57, 0x58, 0x59, 0x5a, 0x63, 0x64, 0x65, 0x66, 0x67, 0x68, 0x69,
    0x6a, 0x73, 0x74, 0x75, 0x76, 0x77, 0x78, 0x79, 0x7a, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89,
    0x8a, 0x92, 0x93, 0x94, 0x95, 0x96, 0x97, 0x98, 0x99, 0x9a, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7,
    0xa8, 0xa9, 0xaa, 0xb2, 0xb3, 0xb4, 0xb5, 0xb6, 0xb7, 0xb8, 0xb9, 0xba, 0xc2, 0xc3, 0xc4, 0xc5,
    0xc6, 0xc7, 0xc8, 0xc9, 0xca, 0xd2, 0xd3, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8, 0xd9, 0xda, 0xe1, 0xe2,
    0xe3, 0xe4, 0xe5, 0xe6, 0xe7, 0xe8, 0xe9, 0xea, 0xf1, 0xf2, 0xf3, 0xf4, 0xf5, 0xf6, 0xf7, 0xf8,
    0xf9, 0xfa,
];
const AC_CHROMA_BITS: [u8; 16] = [0, 2, 1, 2, 4, 4, 3, 4, 7, 5, 4, 4, 0, 1, 2, 0x77];
const AC_CHROMA_VALS: [u8; 162] = [
    0x00, 0x01, 0x02, 0x03, 0x11, 0x04, 0x05, 0x21, 0x31, 0x06, 0x12, 0x41, 0x51, 0x07, 0x61, 0x71,
    0x13, 0x22, 0x32, 0x81, 0x08, 0x14, 0x42, 0x91, 0xa1, 0xb1, 0xc1, 0x09, 0x23, 0x33, 0x52, 0xf0,
    0x15, 0x62, 0x72, 0xd1, 0x0a, 0x16, 0x24, 0x34, 0xe1, 0x25, 0xf1, 0x17, 0x18, 0x19, 0x1a, 0x26,
    0x27, 0x28, 0x29, 0x2a, 0x35, 0x36, 0x37, 0x38, 0x39, 0x3a, 0x43, 0x44, 0x45, 0x46, 0x47, 0x48,
    0x49, 0x4a, 0x53, 0x54, 0x55, 0x56, 0x57, 0x58, 0x59, 0x5a, 0x63, 0x64, 0x65, 0x66, 0x67, 0x68,
    0x69, 0x6a, 0x73, 0x74, 0x75, 0x76, 0x77, 0x78, 0x79, 0x7a, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87,
    0x88, 0x89, 0x8a, 0x92, 0x93, 0x94, 0x95, 0x96, 0x97, 0x98, 0x99, 0x9a, 0xa2, 0xa3, 0xa4, 0xa5,
    0xa6, 0xa7, 0xa8, 0xa9, 0xaa, 0xb2, 0xb3, 0xb4, 0xb5, 0xb6, 0xb7, 0xb8, 0xb9, 0xba, 0xc2, 0xc3,
    0xc4, 0xc5, 0xc6, 0xc7, 0xc8, 0xc9, 0xca, 0xd2, 0xd3, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8, 0xd9, 0xda,
    0xe2, 0xe3, 0xe4, 0xe5, 0xe6, 0xe7, 0xe8, 0xe9, 0xea, 0xf2, 0xf3, 0xf4, 0xf5, 0xf6, 0xf7, 0xf8,
    0xf9, 0xfa,
];

/// A canonical Huffman table: code and length per symbol (ITU T.81 Annex C).
struct Huffman {
    code: [u16; 256],
    len: [u8; 256],
}

impl Huffman {
    fn new(bits: &[u8; 16], vals: &[u8]) -> Self {
        let mut h = Huffman {
            code: [0; 256],
            len: [0; 256],
        };
        let mut code = 0u16;
        let mut k = 0;
        for (l, &n) in bits.iter().enumerate() {
            for _ in 0..n {
                h.code[vals[k] as usize] = code;
                h.len[vals[k] as usize] = l as u8 + 1;
                code += 1;
                k += 1;
            }
            code <<= 1;
        }
        h
    }
}

/// Entropy-coded segment writer with `0xFF` byte stuffing.
struct BitWriter {
    out: Vec<u8>,
    acc: u32,
    n: u32,
}

impl BitWriter {
    fn put(&mut self, bits: u32, len: u32) {
        if len == 0 {
            return;
        }
        self.acc = (self.acc << len) | (bits & ((1u32 << len) - 1));
        self.n += len;
        while self.n >= 8 {
            let b = (self.acc >> (self.n - 8)) as u8;
            self.out.push(b);
            if b == 0xFF {
                self.out.push(0);
            }
            self.n -= 8;
        }
        self.acc &= (1u32 << self.n).wrapping_sub(1);
    }

    /// Pads the last byte with 1-bits (T.81 F.1.2.3).
    fn flush(&mut self) {
        if self.n > 0 {
            let pad = 8 - self.n;
            self.put((1 << pad) - 1, pad);
        }
    }
}

/// The quantisation table of `quality` (1..=100, clamped) in natural order: libjpeg's
/// `jpeg_quality_scaling` and `jpeg_add_quant_table` with `force_baseline`.
fn quant_table(std: &[u32; 64], quality: u8) -> [u32; 64] {
    let q = quality.clamp(1, 100) as u32;
    let scale = if q < 50 { 5000 / q } else { 200 - 2 * q };
    std.map(|v| ((v * scale + 50) / 100).clamp(1, 255))
}

// libjpeg's jfdctint.c constants (CONST_BITS = 13).
const CONST_BITS: i32 = 13;
const PASS1_BITS: i32 = 2;
const FIX_0_298631336: i32 = 2446;
const FIX_0_390180644: i32 = 3196;
const FIX_0_541196100: i32 = 4433;
const FIX_0_765366865: i32 = 6270;
const FIX_0_899976223: i32 = 7373;
const FIX_1_175875602: i32 = 9633;
const FIX_1_501321110: i32 = 12299;
const FIX_1_847759065: i32 = 15137;
const FIX_1_961570560: i32 = 16069;
const FIX_2_053119869: i32 = 16819;
const FIX_2_562915447: i32 = 20995;
const FIX_3_072711026: i32 = 25172;

fn descale(x: i32, n: i32) -> i32 {
    (x + (1 << (n - 1))) >> n
}

/// The `islow` forward DCT of libjpeg (`jpeg_fdct_islow`), in place on level-shifted samples;
/// outputs are scaled up by 8.
fn fdct_islow(d: &mut [i32; 64]) {
    for row in 0..8 {
        let r = &mut d[row * 8..row * 8 + 8];
        let tmp0 = r[0] + r[7];
        let tmp7 = r[0] - r[7];
        let tmp1 = r[1] + r[6];
        let tmp6 = r[1] - r[6];
        let tmp2 = r[2] + r[5];
        let tmp5 = r[2] - r[5];
        let tmp3 = r[3] + r[4];
        let tmp4 = r[3] - r[4];
        let tmp10 = tmp0 + tmp3;
        let tmp13 = tmp0 - tmp3;
        let tmp11 = tmp1 + tmp2;
        let tmp12 = tmp1 - tmp2;
        r[0] = (tmp10 + tmp11) << PASS1_BITS;
        r[4] = (tmp10 - tmp11) << PASS1_BITS;
        let z1 = (tmp12 + tmp13) * FIX_0_541196100;
        r[2] = descale(z1 + tmp13 * FIX_0_765366865, CONST_BITS - PASS1_BITS);
        r[6] = descale(z1 - tmp12 * FIX_1_847759065, CONST_BITS - PASS1_BITS);
        let (o7, o5, o3, o1) = odd_part(tmp4, tmp5, tmp6, tmp7);
        r[7] = descale(o7, CONST_BITS - PASS1_BITS);
        r[5] = descale(o5, CONST_BITS - PASS1_BITS);
        r[3] = descale(o3, CONST_BITS - PASS1_BITS);
        r[1] = descale(o1, CONST_BITS - PASS1_BITS);
    }
    for col in 0..8 {
        let at = |i: usize| col + 8 * i;
        let tmp0 = d[at(0)] + d[at(7)];
        let tmp7 = d[at(0)] - d[at(7)];
        let tmp1 = d[at(1)] + d[at(6)];
        let tmp6 = d[at(1)] - d[at(6)];
        let tmp2 = d[at(2)] + d[at(5)];
        let tmp5 = d[at(2)] - d[at(5)];
        let tmp3 = d[at(3)] + d[at(4)];
        let tmp4 = d[at(3)] - d[at(4)];
        let tmp10 = tmp0 + tmp3;
        let tmp13 = tmp0 - tmp3;
        let tmp11 = tmp1 + tmp2;
        let tmp12 = tmp1 - tmp2;
        d[at(0)] = descale(tmp10 + tmp11, PASS1_BITS);
        d[at(4)] = descale(tmp10 - tmp11, PASS1_BITS);
        let z1 = (tmp12 + tmp13) * FIX_0_541196100;
        d[at(2)] = descale(z1 + tmp13 * FIX_0_765366865, CONST_BITS + PASS1_BITS);
        d[at(6)] = descale(z1 - tmp12 * FIX_1_847759065, CONST_BITS + PASS1_BITS);
        let (o7, o5, o3, o1) = odd_part(tmp4, tmp5, tmp6, tmp7);
        d[at(7)] = descale(o7, CONST_BITS + PASS1_BITS);
        d[at(5)] = descale(o5, CONST_BITS + PASS1_BITS);
        d[at(3)] = descale(o3, CONST_BITS + PASS1_BITS);
        d[at(1)] = descale(o1, CONST_BITS + PASS1_BITS);
    }
}

/// The odd part of the islow butterfly, before descaling: outputs 7, 5, 3, 1.
fn odd_part(tmp4: i32, tmp5: i32, tmp6: i32, tmp7: i32) -> (i32, i32, i32, i32) {
    let z1 = tmp4 + tmp7;
    let z2 = tmp5 + tmp6;
    let z3 = tmp4 + tmp6;
    let z4 = tmp5 + tmp7;
    let z5 = (z3 + z4) * FIX_1_175875602;
    let tmp4 = tmp4 * FIX_0_298631336;
    let tmp5 = tmp5 * FIX_2_053119869;
    let tmp6 = tmp6 * FIX_3_072711026;
    let tmp7 = tmp7 * FIX_1_501321110;
    let z1 = -z1 * FIX_0_899976223;
    let z2 = -z2 * FIX_2_562915447;
    let z3 = -z3 * FIX_1_961570560 + z5;
    let z4 = -z4 * FIX_0_390180644 + z5;
    (
        tmp4 + z1 + z3,
        tmp5 + z2 + z4,
        tmp6 + z2 + z3,
        tmp7 + z1 + z4,
    )
}

/// One component plane, padded to whole blocks.
struct Plane {
    /// Samples per row (a multiple of 8).
    stride: usize,
    rows: usize,
    data: Vec<u8>,
}

impl Plane {
    /// Forward DCT and quantisation of the block at block coordinates `(bx, by)`, in natural
    /// order (libjpeg's `forward_DCT` with divisors `q << 3`, rounding to nearest).
    fn block(&self, bx: usize, by: usize, q: &[u32; 64]) -> [i32; 64] {
        let mut d = [0i32; 64];
        for y in 0..8 {
            for x in 0..8 {
                d[y * 8 + x] = self.data[(by * 8 + y) * self.stride + bx * 8 + x] as i32 - 128;
            }
        }
        fdct_islow(&mut d);
        for (v, q) in d.iter_mut().zip(q) {
            let qval = (*q << 3) as i32;
            *v = if *v < 0 {
                -((-*v + (qval >> 1)) / qval)
            } else {
                (*v + (qval >> 1)) / qval
            };
        }
        d
    }
}

/// libjpeg's fixed-point RGB -> YCbCr (`jccolor.c`, SCALEBITS = 16).
fn ycc(r: i32, g: i32, b: i32) -> (u8, u8, u8) {
    const ONE_HALF: i32 = 1 << 15;
    const CBCR_OFFSET: i32 = 128 << 16;
    let fix = |x: f64| (x * 65536.0 + 0.5) as i32;
    let y = (fix(0.29900) * r + fix(0.58700) * g + fix(0.11400) * b + ONE_HALF) >> 16;
    let cb =
        (-fix(0.16874) * r - fix(0.33126) * g + fix(0.5) * b + CBCR_OFFSET + ONE_HALF - 1) >> 16;
    let cr =
        (fix(0.5) * r - fix(0.41869) * g - fix(0.08131) * b + CBCR_OFFSET + ONE_HALF - 1) >> 16;
    (y as u8, cb as u8, cr as u8)
}

/// Encodes `image` as a baseline JFIF JPEG at `quality` with 4:2:0 chroma subsampling and the
/// standard Huffman tables: the stream Pillow writes for `image.save(buf, "JPEG",
/// quality=quality)` on an RGB image. Sides above 65535 are refused.
///
/// ```
/// use reward::{RgbImage, jpeg};
///
/// let flat = RgbImage::filled(64, 48, [200, 30, 30]);
/// let noisy = RgbImage::from_fn(64, 48, |x, y| {
///     let v = ((x * 73 + y * 151) ^ (x * y)) as u8;
///     [v, v.wrapping_mul(3), v.wrapping_add(90)]
/// });
/// let a = jpeg::encode(&flat, 95).unwrap();
/// let b = jpeg::encode(&noisy, 95).unwrap();
/// assert_eq!(&a[..2], &[0xFF, 0xD8]); // SOI
/// assert_eq!(&a[a.len() - 2..], &[0xFF, 0xD9]); // EOI
/// assert!(b.len() > 2 * a.len());
/// ```
pub fn encode(image: &RgbImage, quality: u8) -> Result<Vec<u8>, RewardError> {
    let (w, h) = (image.width(), image.height());
    if w > 65535 || h > 65535 {
        return Err(RewardError::ImageTooLarge {
            format: "JPEG",
            width: w,
            height: h,
            max: 65535,
        });
    }
    let lq = quant_table(&STD_LUMA_Q, quality);
    let cq = quant_table(&STD_CHROMA_Q, quality);

    // Component geometry (libjpeg jcmaster.c): Y is 2x2, Cb and Cr are 1x1.
    let y_wb = w.div_ceil(8);
    let y_hb = h.div_ceil(8);
    let c_wb = w.div_ceil(2).div_ceil(8);
    let c_hb = h.div_ceil(2).div_ceil(8);
    let mcus_x = w.div_ceil(16);
    let mcus_y = h.div_ceil(16);

    // Colour conversion at full resolution, rows padded to an even count and columns to the
    // downsampler's input width by replication (expand_bottom_edge / expand_right_edge).
    let full_w = (y_wb * 8).max(c_wb * 16);
    let full_h = (mcus_y * 16).max(h);
    let mut yp = vec![0u8; full_w * full_h];
    let mut cbp = vec![0u8; full_w * full_h];
    let mut crp = vec![0u8; full_w * full_h];
    let px = image.as_bytes();
    for y in 0..full_h {
        let sy = y.min(h - 1);
        for x in 0..full_w {
            let sx = x.min(w - 1);
            let i = (sy * w + sx) * 3;
            let (yy, cb, cr) = ycc(px[i] as i32, px[i + 1] as i32, px[i + 2] as i32);
            yp[y * full_w + x] = yy;
            cbp[y * full_w + x] = cb;
            crp[y * full_w + x] = cr;
        }
    }
    // Luma plane: y_wb*8 columns (replicated right edge), rows to a whole iMCU row by
    // replicating the last image row.
    let luma = Plane {
        stride: y_wb * 8,
        rows: mcus_y * 16,
        data: (0..mcus_y * 16)
            .flat_map(|r| {
                let r = r.min(h - 1);
                yp[r * full_w..r * full_w + y_wb * 8].to_vec()
            })
            .collect(),
    };
    // Chroma: h2v2 averaging with bias 1, 2, 1, 2, ... along each output row, over an input of
    // even height (last row replicated), then rows replicated to a whole iMCU row (8 rows).
    let chroma = |p: &[u8]| {
        let out_w = c_wb * 8;
        let real = h.div_ceil(2);
        let mut data = vec![0u8; out_w * mcus_y * 8];
        for oy in 0..mcus_y * 8 {
            let sy = oy.min(real - 1);
            let (r0, r1) = (2 * sy, (2 * sy + 1).min(h - 1));
            let mut bias = 1u32;
            for ox in 0..out_w {
                let (c0, c1) = (2 * ox, 2 * ox + 1);
                let s = p[r0 * full_w + c0] as u32
                    + p[r0 * full_w + c1] as u32
                    + p[r1 * full_w + c0] as u32
                    + p[r1 * full_w + c1] as u32;
                data[oy * out_w + ox] = ((s + bias) >> 2) as u8;
                bias ^= 3;
            }
        }
        Plane {
            stride: out_w,
            rows: mcus_y * 8,
            data,
        }
    };
    let cb = chroma(&cbp);
    let cr = chroma(&crp);
    debug_assert!(luma.rows >= y_hb * 8 && cb.rows >= c_hb * 8);

    let dc_l = Huffman::new(&DC_LUMA_BITS, &DC_LUMA_VALS);
    let ac_l = Huffman::new(&AC_LUMA_BITS, &AC_LUMA_VALS);
    let dc_c = Huffman::new(&DC_CHROMA_BITS, &DC_CHROMA_VALS);
    let ac_c = Huffman::new(&AC_CHROMA_BITS, &AC_CHROMA_VALS);

    let mut bw = BitWriter {
        out: Vec::with_capacity(w * h),
        acc: 0,
        n: 0,
    };
    let mut pred = [0i32; 3];
    let mut encode_block =
        |bw: &mut BitWriter, c: usize, blk: &[i32; 64], dc: &Huffman, ac: &Huffman| {
            let diff = blk[0] - pred[c];
            pred[c] = blk[0];
            let (nbits, bits) = magnitude(diff);
            bw.put(
                dc.code[nbits as usize] as u32,
                dc.len[nbits as usize] as u32,
            );
            bw.put(bits, nbits);
            let mut run = 0;
            for &k in &NATURAL_ORDER[1..] {
                let v = blk[k];
                if v == 0 {
                    run += 1;
                    continue;
                }
                while run > 15 {
                    bw.put(ac.code[0xF0] as u32, ac.len[0xF0] as u32);
                    run -= 16;
                }
                let (nbits, bits) = magnitude(v);
                let sym = (run << 4) as usize | nbits as usize;
                bw.put(ac.code[sym] as u32, ac.len[sym] as u32);
                bw.put(bits, nbits);
                run = 0;
            }
            if run > 0 {
                bw.put(ac.code[0] as u32, ac.len[0] as u32);
            }
        };
    for my in 0..mcus_y {
        for mx in 0..mcus_x {
            // Luma: 2x2 blocks; blocks right of / below the component's last block are dummies
            // with zero AC and the DC of the previous block (jccoefct.c compress_data).
            let mut blocks: [[i32; 64]; 4] = [[0; 64]; 4];
            for by in 0..2 {
                let gy = my * 2 + by;
                for bx in 0..2 {
                    let gx = mx * 2 + bx;
                    let i = by * 2 + bx;
                    blocks[i] = if gy < y_hb {
                        if gx < y_wb {
                            luma.block(gx, gy, &lq)
                        } else {
                            let mut d = [0; 64];
                            d[0] = blocks[i - 1][0];
                            d
                        }
                    } else {
                        let mut d = [0; 64];
                        d[0] = blocks[by * 2 - 1][0];
                        d
                    };
                }
            }
            for b in &blocks {
                encode_block(&mut bw, 0, b, &dc_l, &ac_l);
            }
            encode_block(&mut bw, 1, &cb.block(mx, my, &cq), &dc_c, &ac_c);
            encode_block(&mut bw, 2, &cr.block(mx, my, &cq), &dc_c, &ac_c);
        }
    }
    bw.flush();

    let mut out = Vec::with_capacity(bw.out.len() + 700);
    out.extend_from_slice(&[0xFF, 0xD8]);
    // APP0 JFIF 1.01, no density unit, 1:1, no thumbnail (libjpeg's defaults).
    out.extend_from_slice(&[
        0xFF, 0xE0, 0, 16, b'J', b'F', b'I', b'F', 0, 1, 1, 0, 0, 1, 0, 1, 0, 0,
    ]);
    for (id, q) in [(0u8, &lq), (1, &cq)] {
        out.extend_from_slice(&[0xFF, 0xDB, 0, 67, id]);
        out.extend(NATURAL_ORDER.iter().map(|&k| q[k] as u8));
    }
    out.extend_from_slice(&[0xFF, 0xC0, 0, 17, 8]);
    out.extend_from_slice(&(h as u16).to_be_bytes());
    out.extend_from_slice(&(w as u16).to_be_bytes());
    out.extend_from_slice(&[3, 1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1]);
    for (class_id, bits, vals) in [
        (0x00u8, &DC_LUMA_BITS, &DC_LUMA_VALS[..]),
        (0x10, &AC_LUMA_BITS, &AC_LUMA_VALS[..]),
        (0x01, &DC_CHROMA_BITS, &DC_CHROMA_VALS[..]),
        (0x11, &AC_CHROMA_BITS, &AC_CHROMA_VALS[..]),
    ] {
        let len = 2 + 1 + 16 + vals.len();
        out.extend_from_slice(&[0xFF, 0xC4]);
        out.extend_from_slice(&(len as u16).to_be_bytes());
        out.push(class_id);
        out.extend_from_slice(bits);
        out.extend_from_slice(vals);
    }
    out.extend_from_slice(&[0xFF, 0xDA, 0, 12, 3, 1, 0x00, 2, 0x11, 3, 0x11, 0, 63, 0]);
    out.extend_from_slice(&bw.out);
    out.extend_from_slice(&[0xFF, 0xD9]);
    Ok(out)
}

/// JPEG magnitude category and the bits that follow it (T.81 F.1.2.1).
fn magnitude(v: i32) -> (u32, u32) {
    let a = v.unsigned_abs();
    let n = 32 - a.leading_zeros();
    let bits = if v < 0 { (v - 1) as u32 } else { v as u32 };
    (n, if n == 0 { 0 } else { bits & ((1 << n) - 1) })
}

/// The encoded size of `image` at `quality`, in kilobytes (`bytes / 1000`, DDPO's unit).
pub fn size_kb(image: &RgbImage, quality: u8) -> Result<f64, RewardError> {
    Ok(encode(image, quality)?.len() as f64 / 1000.0)
}

/// Which of DDPO's two JPEG rewards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JpegReward {
    /// `+size_kb`: rewards detail (`jpeg_incompressibility`).
    Incompressibility,
    /// `-size_kb`: rewards flat, simple images (`jpeg_compressibility`).
    Compressibility,
}

/// DDPO's JPEG reward as a [`Scorer`]; reads images only.
///
/// ```
/// use reward::{Batch, JpegReward, JpegScorer, RgbImage, Scorer};
///
/// let images = vec![RgbImage::filled(32, 32, [10, 200, 10])];
/// let s = JpegScorer::ddpo(JpegReward::Compressibility);
/// let out = s.score(Batch::new(Some(&images), None, None).unwrap()).unwrap();
/// let v = out[0].get("jpeg_compressibility").unwrap();
/// assert!(v < 0.0 && v > -1.0, "{v}");
/// ```
#[derive(Clone, Debug)]
pub struct JpegScorer {
    /// Which reward.
    pub reward: JpegReward,
    /// Encoder quality (DDPO: 95).
    pub quality: u8,
}

impl JpegScorer {
    /// DDPO's definition: quality 95.
    pub fn ddpo(reward: JpegReward) -> Self {
        Self {
            reward,
            quality: DDPO_QUALITY,
        }
    }

    fn component(&self) -> &'static str {
        match self.reward {
            JpegReward::Incompressibility => INCOMPRESSIBILITY,
            JpegReward::Compressibility => COMPRESSIBILITY,
        }
    }
}

impl Scorer for JpegScorer {
    fn name(&self) -> String {
        format!("{} (quality {})", self.component(), self.quality)
    }

    fn required_inputs(&self) -> &[Input] {
        &[Input::Image]
    }

    fn components(&self) -> Vec<String> {
        vec![self.component().to_string()]
    }

    fn chunk_size(&self) -> usize {
        64
    }

    fn score_chunk(&self, batch: Batch<'_>) -> Result<Vec<Components>, RewardError> {
        let images = batch.images().expect("checked by score");
        images
            .iter()
            .map(|im| {
                let kb = size_kb(im, self.quality)?;
                let v = match self.reward {
                    JpegReward::Incompressibility => kb,
                    JpegReward::Compressibility => -kb,
                };
                Ok(Components::new().with(self.component(), v))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quality_95_tables_are_libjpeg_scaling() {
        let q = quant_table(&STD_LUMA_Q, 95);
        // scale = 10: (16*10+50)/100 = 2, (11*10+50)/100 = 1
        assert_eq!(&q[..3], &[2, 1, 1]);
        assert_eq!(quant_table(&STD_LUMA_Q, 50), STD_LUMA_Q);
    }

    #[test]
    fn dct_of_a_flat_block_is_dc_only() {
        let mut d = [40i32; 64];
        fdct_islow(&mut d);
        assert_eq!(d[0], 40 * 64); // 8 * (mean * 8)
        assert!(d[1..].iter().all(|v| *v == 0));
    }

    #[test]
    fn magnitude_categories() {
        assert_eq!(magnitude(0), (0, 0));
        assert_eq!(magnitude(1), (1, 1));
        assert_eq!(magnitude(-1), (1, 0));
        assert_eq!(magnitude(-3), (2, 0));
        assert_eq!(magnitude(5), (3, 5));
    }
}
