//! SpecAugment mask counts and widths, spec_sub and spec_trim.

use asrforge::data::config::{SpecAugConf, SpecSubConf, SpecTrimConf};
use asrforge::data::specaug::{spec_aug, spec_sub, spec_trim};
use asrforge::tensor::rng::Rng;

#[test]
fn masks_have_configured_counts_and_widths() {
    let (t, f) = (200, 80);
    let conf = SpecAugConf { num_t_mask: 2, num_f_mask: 3, max_t: 50, max_f: 10 };
    for seed in 0..50 {
        let mut x = vec![1.0f32; t * f];
        let masks = spec_aug(&mut x, t, f, &conf, &mut Rng::new(seed));
        assert_eq!(masks.iter().filter(|m| !m.time).count(), 3);
        assert_eq!(masks.iter().filter(|m| m.time).count(), 2);
        for m in &masks {
            let (limit, max) = if m.time { (t, 50) } else { (f, 10) };
            assert!(m.start < limit && m.end <= limit && m.end > m.start, "{m:?}");
            assert!(m.end - m.start <= max, "{m:?} wider than {max}");
        }
        // Exactly the masked cells are zero.
        for ti in 0..t {
            for fi in 0..f {
                let masked = masks.iter().any(|m| if m.time { (m.start..m.end).contains(&ti) } else { (m.start..m.end).contains(&fi) });
                assert_eq!(x[ti * f + fi] == 0.0, masked, "cell ({ti},{fi})");
            }
        }
    }
}

#[test]
fn mask_widths_cover_the_range() {
    // Over many draws away from the edges, widths 1..=max_f all occur (randint includes both ends).
    let conf = SpecAugConf { num_t_mask: 0, num_f_mask: 1, max_t: 1, max_f: 4 };
    let mut seen = [0usize; 5];
    let mut rng = Rng::new(1);
    for _ in 0..2000 {
        let mut x = vec![1.0f32; 10 * 80];
        let m = spec_aug(&mut x, 10, 80, &conf, &mut rng)[0];
        if m.start + 4 <= 80 {
            seen[m.end - m.start] += 1;
        }
    }
    assert_eq!(seen[0], 0);
    assert!(seen[1..].iter().all(|&n| n > 300), "{seen:?}");
}

#[test]
fn spec_sub_copies_earlier_frames() {
    let (t, f) = (100, 4);
    // Row i holds the value i, so each replaced row must hold an earlier-or-equal index.
    let orig: Vec<f32> = (0..t * f).map(|i| (i / f) as f32).collect();
    let mut x = orig.clone();
    spec_sub(&mut x, t, f, &SpecSubConf { max_t: 20, num_t_sub: 3 }, &mut Rng::new(4));
    for ti in 0..t {
        let row = &x[ti * f..(ti + 1) * f];
        assert!(row.iter().all(|&v| v == row[0]), "row {ti} is one frame");
        assert!(row[0] <= ti as f32, "row {ti} took frame {} (from the future)", row[0]);
    }
}

#[test]
fn spec_trim_drops_under_half() {
    let f = 3;
    for seed in 0..30 {
        let mut x = vec![1.0f32; 100 * f];
        let kept = spec_trim(&mut x, 100, f, &SpecTrimConf { max_t: 20 }, &mut Rng::new(seed));
        assert!((80..100).contains(&kept), "kept {kept}");
        assert_eq!(x.len(), kept * f);
    }
    // 10 frames: any trim of >= 5 is refused, so at most 4 are dropped.
    let mut x = vec![1.0f32; 10 * f];
    let kept = spec_trim(&mut x, 10, f, &SpecTrimConf { max_t: 20 }, &mut Rng::new(0));
    assert!(kept >= 6 || kept == 10, "kept {kept}");
}
