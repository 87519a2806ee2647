"""`image_search{image}` (official: `image_search{url}`): local near-duplicate index or a remote Lens-style API.

Backends: `local` (`tools.image_search`: global-descriptor shortlist + SIFT verification over the folders of
`image_dirs(cfg)`), `remote` (`tools.remote.LensClient`; needs the image as a public http(s) URL, i.e. the
official `url`). No confident match -> `no_result` (ok=True).
"""

import ml_collections
import numpy as np

from tools import base
from tools import schema


def image_dirs(cfg: ml_collections.ConfigDict) -> list[str] | None:
  """The folders the local image_search indexes (None = the default landmark folder)."""
  if cfg.image_search.get('image_dirs'):
    return [str(d) for d in cfg.image_search.image_dirs]
  if cfg.image_search.image_dir:
    return [cfg.image_search.image_dir]
  if schema.data_dir(cfg):
    return [f'{schema.data_dir(cfg)}/images/landmarks']
  return None


def _make(cfg: ml_collections.ConfigDict):
  from tools import image_search  # pylint: disable=import-outside-toplevel
  schema.check_backend('image_search', cfg.image_search.backend)

  def body(image: np.ndarray | str) -> base.ToolResult:
    if cfg.image_search.backend == 'remote':
      from tools import remote  # pylint: disable=import-outside-toplevel
      if not isinstance(image, str):
        raise base.ToolError('backend_error', 'the remote image_search needs the image as a public http(s) URL '
                                              '(official profile: url); this image has none')
      matches = remote.LensClient(cfg.image_search.lens).search(image)
      if not matches:
        return base.error('no_result', 'No visual matches for this image.')
      return base.ToolResult(ok=True, text=remote.format_lens(matches))
    if isinstance(image, str):
      raise schema.ArgumentError(f"argument 'image' must be an image reference like \"img_1\" for the local "
                                 f'image_search, got {image!r:.60}')
    index = image_search.get_index(image_dirs(cfg))
    match = index.best(image)
    if match is None:
      return base.error('no_result', 'No confident match for this image in the image collection.')
    return base.ToolResult(ok=True, text=image_search.describe(match, index.names[match.stem]))
  return body


SPEC = schema.register(schema.ToolSpec(
    name='image_search',
    description='Reverse image search: names the landmark in an image and its Wikipedia article.',
    params=(schema.Param('image', 'image', schema.IMAGE_DESC),),
    make=_make,
    official=schema.OfficialSchema('image_search', (
        schema.Param('url', 'string', 'Image URL, or an image reference such as "img_1".'),))))
