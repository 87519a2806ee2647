"""osvl-jax: OpenSearch-VL (arXiv 2605.05185) in JAX/Flax."""

import setuptools

setuptools.setup(
    name='osvl-jax',
    version='0.1.0',
    description='TPU-first JAX/Flax reimplementation of OpenSearch-VL multimodal deep-search agents',
    python_requires='>=3.11',
    packages=setuptools.find_packages(include=['osvl_jax*', 'tools*', 'data_pipeline*']),
    package_data={'osvl_jax.judges.prompts': ['*.txt']},  # versioned judge / agent prompts
    install_requires=[
        'jax==0.10.2',
        'flax==0.12.8',
        'optax==0.2.8',
        'orbax-checkpoint==0.12.8',
        'tensorstore==0.1.86',
        # gs:// workdirs: orbax's directory operations go through etils.epath -> fsspec -> gcsfs (tensorstore
        # writes the arrays itself). 2026.10.1 is the gcsfs release that accepts datasets' fsspec 2026.9.0.
        'gcsfs==2026.10.1',
        'fsspec==2026.9.0',
        'absl-py==2.5.1',
        'ml-collections==1.1.0',
        'numpy>=2.0,<3',
        'transformers==5.24.0',
        'tokenizers==0.23.3',
        'datasets==5.2.0',
        # Data pipeline `wiki` stage: pages-articles XML streaming and wikitext parsing (data_pipeline/wiki_xml.py).
        'mwparserfromhell==0.7.2',
        'mwxml==0.3.8',
        'openai==3.57.0',
        'opencv-contrib-python-headless==5.0.0.93',
        'bm25s==0.3.16',
        'httpx==0.28.1',
        # Rollout serving (osvl_jax.serve, osvl_jax.rollout.remote.sglang_client): the HTTP app and the real
        # SGLang router (a Rust binary, runs on CPU) that the serving tests put in front of two workers.
        'fastapi==0.163.2',
        'uvicorn==0.54.0',
        'sglang-router==0.3.2',
        # SIMD base64 that releases the GIL: decoding a flood of image uploads (4 MB each, ~10 ms with the
        # stdlib's, GIL held) no longer stalls the server's event loop (osvl_jax/serve/request_limits.py).
        'pybase64==1.5.1',
        # uvicorn's C HTTP parser (what `uvicorn[standard]` installs; uvicorn picks it over the pure-Python h11):
        # behind a flood of large uploads the event loop parses them in a fraction of the time (BENCHMARKS.md).
        'httptools==0.7.1',
        'json-repair==0.64.6',  # tool-call JSON repair (trajectory.actions.loads_lenient)
        # Local OCR (PP-OCRv6 models ship in the wheel). It pulls opencv-python-headless, whose cv2 shadows the
        # contrib build: the Makefile reinstalls opencv-contrib-python-headless after this (SIFT, dnn_superres).
        'rapidocr==3.10.0',
        'onnxruntime==1.32.0',
        'pillow==13.0.0',
        'safetensors==0.8.0',
        'tqdm==4.70.1',
        'matplotlib==3.11.2',  # eval: the tool-budget sweep plot (osvl_jax.eval.plots)
        'tensorboardX==2.6.5',
        # CPU wheel on disk; the image processor and HF reference model need it.
        'torch==2.13.0',
    ],
    extras_require={
        # gcp-storage-emulator: a local fake GCS server for the gs:// checkpoint test (tests/distributed);
        # pytest-xdist: `make test` runs the test files on 2 workers (`-n 2 --dist loadfile`).
        'dev': ['pytest==9.0.3', 'pytest-timeout==2.4.0', 'pytest-xdist==3.8.0', 'gcp-storage-emulator==2026.7.19'],
    },
)
