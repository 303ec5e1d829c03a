# A public base with what a distci cell build needs and the base lacks: Python 3 with
# venv and headers, gcc/g++ (Inductor and Triton compile C). NVIDIA's CUDA runtime
# images have neither. Built once per runner and base by distci/images/base.py
# (ensure_prepared): this is the one image build with network (the base's own package
# mirror); cell images then build FROM the result with no network. A base that already
# has them (the air-gapped debootstrap base) is only relabelled.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG PACKAGES="python3 python3-venv python3-dev gcc g++ ca-certificates"
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Versions come from the base's pinned distribution snapshot, not pinned one by one.
# hadolint ignore=DL3008
RUN if command -v python3 >/dev/null && command -v gcc >/dev/null \
      && python3 -c "import ensurepip, sysconfig, os; assert os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h'))"; then \
      echo "distci: the base already has python3 (venv, headers) and gcc"; \
    else \
      apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${PACKAGES} \
      && rm -rf /var/lib/apt/lists/*; \
    fi
ARG BASE_IMAGE
LABEL distci.prepared-from="${BASE_IMAGE}" distci.prepared-packages="${PACKAGES}"
