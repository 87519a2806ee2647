"""The seven tools, one module each (DESIGN.md §5): its `ToolSpec` (schema, official schema) and body factory.

Importing this package registers them in `tools.schema.TOOLS`, in this order; `tools.env` imports it.
"""

from tools.specs import text_search  # pylint: disable=unused-import
from tools.specs import image_search  # pylint: disable=unused-import
from tools.specs import ocr  # pylint: disable=unused-import
from tools.specs import crop  # pylint: disable=unused-import
from tools.specs import sharpen  # pylint: disable=unused-import
from tools.specs import super_resolution  # pylint: disable=unused-import
from tools.specs import perspective_correct  # pylint: disable=unused-import
from tools.specs import lookup  # pylint: disable=unused-import  # the learning testbed's table (configs/lookup.py)
