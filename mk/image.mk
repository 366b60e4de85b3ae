# The slurmgate image, built here without Docker or a registry. Included from the main Makefile.
#
#   make image    build the root Containerfile with buildah (chroot isolation, its own vfs
#                 store) on a debootstrapped Debian bookworm + Python 3.11 base; check it (entry
#                 points, uid 65532, no compiler) and export it as an OCI archive, whose path
#                 is printed last (cluster/build-image.sh; all of it in ~/.cache/slurmgate/images)
#
# The base is made once (~1 min); the app image is rebuilt (~25 s) only when the Containerfile,
# pyproject.toml or the package sources change. IMAGE_TAG defaults to the package version, the
# tag the release image has in kustomize/base/deployment/kustomization.yaml, so an overlay only
# swaps the name: `kustomize edit set image ghcr.io/slurmgate/slurmgate=$(IMAGE_NAME):$(IMAGE_TAG)`.

IMAGE_NAME ?= localhost/slurmgate/slurmgate
IMAGE_TAG ?= $(or $(shell sed -n 's/^version *= *"\(.*\)"/\1/p' pyproject.toml),dev)

.PHONY: image

image:
	bash cluster/build-image.sh $(IMAGE_NAME) $(IMAGE_TAG)
