"""Quality and speed figures of the tools (issue 5 acceptance); prints one `name=value` line per figure.

Run: `.venv/bin/python bench/tools_quality.py` (about 3-5 min on 2 cores). Expected (BENCHMARKS.md):
sharpen_psnr_gain_db > 0, sharpen_laplacian_gain > 1, perspective_max_corner_error_deg < 3, sr_psnr_gain_db > 0,
ocr_cer_english <= 0.15, image_search_top1 >= 0.95, image_search_ms_per_query_10k <= 50 (target),
injected == observed. Helpers (degradations, transcripts, rollouts) are the tests' own, from tests/tools/.
Feeds BENCHMARKS.md, "Tools".
"""

import argparse
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]


def psnr(a, b):
  return 10 * np.log10(255.0 ** 2 / np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  return p.parse_args(argv)


def main(argv=None):
  parse_args(argv)  # --help prints the usage and exits before any heavy import.
  import cv2  # pylint: disable=g-import-not-at-top
  sys.path[:0] = [str(ROOT), str(ROOT / 'tests' / 'tools')]
  from osvl_jax import paths
  from tools import env as tools_env
  from tools import image_io, image_ops, image_search
  import test_failure_injection
  import test_image_search
  import test_pixel_tools

  images = paths.data_dir() / 'images'
  env = tools_env.ToolEnv({'enabled': ('sharpen', 'super_resolution', 'perspective_correct'), 'super_resolution': {
      'model_dir': str(paths.data_dir() / 'superres' / 'models'), 'model': 'FSRCNN'}})

  astronaut = image_io.load_image(images / 'photos/astronaut.png')
  gains = []
  for sigma in (1, 1.5, 2):
    blurred = cv2.GaussianBlur(astronaut, (0, 0), sigma)
    out = env.call('sharpen', {'image': 'img_1'}, [blurred]).images[0]
    gains.append(psnr(astronaut, out) - psnr(astronaut, blurred))
  print(f'sharpen_psnr_gain_db={min(gains):.2f}  (sigma 1/1.5/2: {", ".join(f"{g:.2f}" for g in gains)})')
  clock = image_io.load_image(images / 'blur/clock_motion.png')
  out = env.call('sharpen', {'image': 'img_1'}, [clock]).images[0]
  print(f'sharpen_laplacian_gain={image_ops.laplacian_variance(out) / image_ops.laplacian_variance(clock):.2f}')

  card = image_io.load_image(images / 'documents/notecard_perspective.png')
  r = env.call('perspective_correct', {'image': 'img_1'}, [card])
  assert r.ok and r.images, r.text
  out, _ = image_ops.warp_quad(card, image_ops.find_document_quad(card), margin=0.08)
  print(f'perspective_max_corner_error_deg={test_pixel_tools.card_corner_error_deg(out):.2f}')

  sr_gains = []
  for name in ('astronaut.png', 'coffee.png', 'chelsea.png'):
    original = image_io.load_image(images / 'photos' / name)
    original = original[:original.shape[0] // 2 * 2, :original.shape[1] // 2 * 2]
    small = cv2.resize(original, None, fx=0.5, fy=0.5, interpolation=cv2.INTER_AREA)
    fsrcnn = env.call('super_resolution', {'image': 'img_1', 'scale': 2}, [small]).images[0]
    bicubic, _ = image_ops.super_resolve(small, 2, None)
    sr_gains.append(psnr(original, fsrcnn) - psnr(original, bicubic))
  print(f'sr_psnr_gain_db={sr_gains[0]:.2f}  (astronaut; coffee {sr_gains[1]:.2f}, chelsea {sr_gains[2]:.2f})')

  print(f'ocr_cer_english={test_pixel_tools.ocr_cer_english():.4f}')

  t0 = time.perf_counter()
  index = image_search.ImageIndex(test_image_search.collection_dirs())
  build = time.perf_counter() - t0
  photos = test_image_search.query_photos()
  queries = [(stem, d(im)) for d in test_image_search.DEGRADATIONS for stem, im in photos.items()]
  hits = sum(index.rank(q)[0].stem == stem for stem, q in queries)
  print(f'image_search_top1={hits / len(queries):.4f}  ({hits}/{len(queries)}; {len(index)} images indexed in '
        f'{build:.1f} s)')
  rng = np.random.default_rng(0)
  t0 = time.perf_counter()
  for i in range(10_000):
    index.add(f'distractor_{i}', image_search.synthetic_distractor(rng))
  add_s = time.perf_counter() - t0
  index.shortlist(queries[0][1])  # Stacks the new rows once.
  sample = queries[::5]
  t0, c0 = time.perf_counter(), time.thread_time()
  hits10k = sum(index.rank(q)[0].stem == stem for stem, q in sample)
  wall, cpu = (time.perf_counter() - t0) / len(sample), (time.thread_time() - c0) / len(sample)
  print(f'image_search_ms_per_query_10k={1000 * wall:.1f}  (cpu {1000 * cpu:.1f} ms; top1 with distractors '
        f'{hits10k}/{len(sample)}; {len(index)} entries, 10k added in {add_s:.0f} s)')

  _, injected, observed = test_failure_injection.rollouts_with_injected_failures(100, 0.5)
  print(f'injected={sum(injected.values())} observed={sum(observed.values())}  (by kind: injected {injected}, '
        f'observed {observed})')


if __name__ == '__main__':
  main()
