#!/usr/bin/env bash
# What a main.py run needs on a GPU machine without network access whose image lacks it (Python 3.12 with torch),
# built here into .gpu/ (git-ignored, ~54 MB, small enough to copy with the checkout): Ray without its jars and
# libraries we do not use, and sglang-router, as xz tarballs; hydra, megatron-core, math-verify (rm_type=math), the
# router's and Ray's small dependencies as cp312 wheels; and .gpu/setup.sh, which runs first on the GPU machine:
#     bash tools/gpu_carry.sh                                     # here, once
#     bash .gpu/setup.sh && python3 -m pytest tests/gpu/... -s    # there, with .gpu/ copied beside the checkout
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu
rm -rf "$out" && mkdir -p "$out/whl" "$out/dl"
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
pins=(ray==2.60.0 torchao==0.18.0 sglang-router==0.3.2 hydra-core==1.3.8 omegaconf==2.3.1 megatron-core==0.16.1 jsonschema==4.26.0
  jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 setproctitle==1.3.8 orjson==3.13.0
  fastapi==0.136.3 starlette==1.10.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0
  typing-inspection==0.4.5 uvicorn==0.54.0 math-verify==0.9.0 latex2sympy2_extended==1.11.0)
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d "$out/dl" "${pins[@]}"
.venv/bin/python -m pip wheel -q --no-deps -w "$out/dl" antlr4-python3-runtime==4.9.3  # an sdist on PyPI
for name in ray sglang_router; do
  mkdir -p "$out/$name" && (cd "$out/$name" && unzip -q ../dl/"$name"-*.whl)
done
rm -rf "$out"/ray/ray/{jars,rllib,data,train,tune,serve,llm}  # Ray core, its dashboard and client stay
(cd "$out/ray" && tar cf - . | xz -T2 -6 > ../ray.tar.xz)
(cd "$out/sglang_router" && tar cf - . | xz -T2 -6 > ../sgr.tar.xz)
mkdir -p "$out/fp8" && mv "$out"/dl/torchao-*.whl "$out/fp8/"  # off the shared path: transformers imports torchao
find "$out/dl" -name '*.whl' ! -name 'ray-*' ! -name 'sglang_router-*' -exec mv {} "$out/whl/" \;
rm -rf "$out/dl" "$out/ray" "$out/sglang_router"
cat > "$out/setup.sh" <<'SETUP'
# On the GPU machine: the wheels into /tmp/site, Ray and sglang-router unpacked, all three behind the image's own
# site-packages (a .pth file), so the image's versions win.
set -e
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/whl/*.whl
# torchao for FP8 runs only (PYTHONPATH=/tmp/torchao): importable everywhere, transformers would import it in every
# process that loads a model
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/torchao .gpu/fp8/*.whl
mkdir -p /tmp/ray /tmp/sgr
tar xJf .gpu/ray.tar.xz -C /tmp/ray &
tar xJf .gpu/sgr.tar.xz -C /tmp/sgr &
wait
SITE=$(python3 -c 'import site; print(site.getsitepackages()[0])')
printf '/tmp/site\n/tmp/ray\n/tmp/sgr\n' > "$SITE/zz_carried.pth"
python3 -c "import ray, sglang_router.launch_router, hydra, megatron.core; print('carried ok', ray.__version__)"
SETUP
du -sh "$out"
