"""Run an emitted one-device module with LLVM's own JIT (`mlir-runner-22`) and read its results.

The module's function is called from a `main` that holds the inputs as constants; every result
is converted to f32 and printed with the runner library's `printMemrefF32`. The lowering to LLVM
is upstream's: bufferize, linalg to loops, `linalg.softmax` decomposed by its own interface (a
transform script), then every dialect to LLVM.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np

from autoshard.mlir.toolchain import mlir_opt

RUNNER = "mlir-runner-22"
OPT = "mlir-opt-22"
LIBRARIES = ("libmlir_runner_utils.so", "libmlir_c_runner_utils.so")
LIBRARY_DIR = Path("/usr/lib/llvm-22/lib")

DECOMPOSE_SOFTMAX = """
  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    %softmax = transform.structured.match ops{["linalg.softmax"]} in %root : (!transform.any_op) -> !transform.any_op
    %parts = transform.structured.decompose_interface %softmax : (!transform.any_op) -> !transform.any_op
    transform.yield
  }
"""
TO_LLVM = ("--convert-elementwise-to-linalg",
           "--one-shot-bufferize=bufferize-function-boundaries function-boundary-type-conversion=identity-layout-map",
           "--convert-linalg-to-loops", "--convert-scf-to-cf", "--expand-strided-metadata", "--lower-affine",
           "--convert-math-to-llvm", "--convert-math-to-libm", "--convert-arith-to-llvm", "--finalize-memref-to-llvm",
           "--convert-func-to-llvm", "--convert-cf-to-llvm", "--convert-index-to-llvm", "--reconcile-unrealized-casts")
ELEMENT = {np.dtype(np.float32): "f32", np.dtype(np.int32): "i32", np.dtype(np.int64): "i64", np.dtype(bool): "i1"}
TO_F32 = {"f32": None, "i32": "arith.sitofp", "i64": "arith.sitofp", "i1": "arith.uitofp", "bf16": "arith.extf",
          "f16": "arith.extf"}


def libraries() -> list[Path]:
    """The runner's support libraries (mlir-22-tools installs them with the runner, as the other
    MLIR tests need that package: a missing one is an error, not a skip)."""
    found = [next(iter(sorted(LIBRARY_DIR.glob(name + "*"))), None) for name in LIBRARIES]
    if not all(found) or shutil.which(RUNNER) is None:
        raise AssertionError(f"{RUNNER} and {', '.join(LIBRARIES)} are needed (Debian: apt-get install mlir-22-tools)")
    return found


def _literal(value: np.ndarray) -> str:
    def nested(x: object) -> str:
        if isinstance(x, list):
            return "[" + ", ".join(nested(v) for v in x) + "]"
        if isinstance(x, bool):
            return "true" if x else "false"
        return repr(float(x)) if isinstance(x, float) else str(x)
    return nested(value.tolist())


def signature(module: str, function: str) -> tuple[list[str], list[str], list[str]]:
    """The argument names, argument types and result types of `function` in the module's text."""
    header = re.search(rf"func\.func @{function}\((.*?)\) -> \(?(.*?)\)? \{{$", module, re.MULTILINE)
    assert header, f"no function @{function} in the module"
    arguments = re.findall(r"%([\w.]+): (tensor<[^>]*>)", header.group(1))
    results = re.findall(r"tensor<[^>]*>", header.group(2))
    return [name for name, _ in arguments], [type_ for _, type_ in arguments], results


def run_module(module: str, function: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Call `function` of an emitted one-device module on `inputs`; its results as f32 arrays."""
    body = "\n".join(line for line in module.splitlines()
                     if not line.startswith(("//", "shard.grid", "mesh.mesh")))
    _, arguments, results = signature(body, function)
    main = ["func.func private @printMemrefF32(memref<*xf32>)", "func.func @main() {"]
    for i, (value, type_) in enumerate(zip(inputs, arguments)):
        main.append(f"  %in{i} = arith.constant dense<{_literal(value)}> : {type_}")
    outs = [f"%out{i}" for i in range(len(results))]
    main.append(f"  {', '.join(outs)} = func.call @{function}({', '.join(f'%in{i}' for i in range(len(inputs)))}) : "
                f"({', '.join(arguments)}) -> ({', '.join(results)})")
    for i, type_ in enumerate(results):
        element = type_[:-1].split("x")[-1].removeprefix("tensor<")
        as_f32 = type_.replace(element + ">", "f32>")
        value = f"%out{i}"
        if TO_F32[element]:
            main.append(f"  %f{i} = {TO_F32[element]} %out{i} : {type_} to {as_f32}")
            value = f"%f{i}"
        memref = as_f32.replace("tensor<", "memref<")
        main.append(f"  %m{i} = bufferization.to_buffer {value} : {as_f32} to {memref}")
        main.append(f"  %u{i} = memref.cast %m{i} : {memref} to memref<*xf32>")
        main.append(f"  func.call @printMemrefF32(%u{i}) : (memref<*xf32>) -> ()")
    main.append("  return\n}")
    program = ("module attributes {transform.with_named_sequence} {\n" + body + "\n" + "\n".join(main) + "\n"
               + DECOMPOSE_SOFTMAX + "}\n")
    decomposed = mlir_opt(program, OPT, ["--transform-interpreter", "--test-transform-dialect-erase-schedule"])
    lowered = mlir_opt(decomposed, OPT, TO_LLVM)
    command = [RUNNER, "-e", "main", "-entry-point-result=void", "-shared-libs=" + ",".join(map(str, libraries()))]
    done = subprocess.run(command, input=lowered, capture_output=True, text=True, timeout=300)
    if done.returncode:
        raise AssertionError(f"{RUNNER} failed:\n{done.stderr[:4000]}")
    return _read_printed(done.stdout)


def _read_printed(text: str) -> list[np.ndarray]:
    """Arrays from `printMemrefF32`'s output: a header with the sizes, then nested brackets."""
    arrays = []
    for block in text.split("Unranked Memref")[1:]:
        sizes = [int(s) for s in re.search(r"sizes = \[([^\]]*)\]", block).group(1).split(",") if s.strip()]
        data = block.split("data =", 1)[1]
        numbers = [float(v) for v in re.findall(r"[-+]?(?:\d+\.?\d*(?:e[-+]?\d+)?|inf|nan)", data)]
        arrays.append(np.array(numbers, dtype=np.float32).reshape(sizes))
    return arrays
