# nanoZeRO on Debian 12, for laptops that are not Debian or Ubuntu: macOS (Docker Desktop, Intel or
# Apple silicon) and Windows (Docker Desktop; or skip Docker and use WSL2, see notebooks/00_workshop.md).
#   docker build -t nanozero .                                  # once: installs, builds the trainers
#   docker run --rm -it nanozero make run STEPS=50              # the short tour (make run: the full one)
#   docker run --rm -it nanozero make test                      # every test suite
#   docker run --rm -it -p 8888:8888 nanozero make notebooks NOTEBOOK_IP=0.0.0.0   # then open the URL
#   docker run --rm -it -v "$PWD/exercises:/nanozero/exercises" nanozero bash      # exercises kept on the host
# What it installs is what `make deps` installs on any Debian machine (scripts/install_deps.sh, as
# root: apt-get, and requirements.txt into .venv), so the image and a bare machine cannot drift apart.
FROM debian:bookworm

ENV DEBIAN_FRONTEND=noninteractive
# make to start with; git for `make diff WORDS=1`; less for paging coloured diffs (less -R)
RUN apt-get update && apt-get install -y --no-install-recommends make git less ca-certificates \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /nanozero
# the dependencies first, in their own layer: a change to the code does not reinstall them
COPY scripts/install_deps.sh scripts/
COPY requirements.txt ./
RUN bash scripts/install_deps.sh && rm -rf /var/lib/apt/lists/*

COPY . .
# the trainers and tools (make run's), for this machine's CPU; make test builds the rest on first use
RUN make CUDA=0 -j"$(nproc)" build/bin/stage0_ddp build/bin/stage1 build/bin/stage2 build/bin/stage3 \
        build/bin/offload build/bin/zero_estimate build/bin/generate
ENV CUDA=0
EXPOSE 8888
CMD ["make", "run", "STEPS=50"]
