# Certificates and kustomize rendering. Included from the main Makefile.
#
#   make certs        webhook CA + serving cert (SANs: service names + 127.0.0.1) into
#                     $(RUN_DIR)/certs, and kustomize/overlays/local/generated/webhook-patch.yaml
#   make certs-kind   the same for overlays/kind (certs go into its generated/ dir)
#   make render-local / render-kind   print the rendered overlay
#
# Certificates are reused until they expire within $(CERT_RENEW_BEFORE_DAYS) days.

RUN_DIR ?= /tmp/slurmgate
PYTHON ?= .venv/bin/python
KUBECTL ?= kubectl

CERTS_DIR ?= $(RUN_DIR)/certs
WEBHOOK_NAMESPACE ?= slurmgate-system
WEBHOOK_SERVICE ?= slurmgate-webhook
LOCAL_WEBHOOK_URL ?= https://127.0.0.1:9443/mutate
CERT_DAYS ?= 365
CERT_RENEW_BEFORE_DAYS ?= 30

LOCAL_OVERLAY := kustomize/overlays/local
KIND_OVERLAY := kustomize/overlays/kind
KIND_GEN := $(KIND_OVERLAY)/generated

.PHONY: certs certs-kind render-local render-kind

certs:
	$(PYTHON) -m slurmgate.certs webhook --out $(CERTS_DIR) \
	  --namespace $(WEBHOOK_NAMESPACE) --service $(WEBHOOK_SERVICE) --ip 127.0.0.1 \
	  --days $(CERT_DAYS) --renew-before-days $(CERT_RENEW_BEFORE_DAYS) \
	  --secret-manifest $(CERTS_DIR)/secret.yaml --ca-bundle-out $(CERTS_DIR)/ca-bundle.b64
	$(PYTHON) -m slurmgate.certs webhook-patch --ca-bundle-file $(CERTS_DIR)/ca-bundle.b64 \
	  --url $(LOCAL_WEBHOOK_URL) --out $(LOCAL_OVERLAY)/generated/webhook-patch.yaml

certs-kind:
	$(PYTHON) -m slurmgate.certs webhook --out $(KIND_GEN) \
	  --namespace $(WEBHOOK_NAMESPACE) --service $(WEBHOOK_SERVICE) \
	  --days $(CERT_DAYS) --renew-before-days $(CERT_RENEW_BEFORE_DAYS) \
	  --ca-bundle-out $(KIND_GEN)/ca-bundle.b64
	$(PYTHON) -m slurmgate.certs webhook-patch --ca-bundle-file $(KIND_GEN)/ca-bundle.b64 \
	  --out $(KIND_GEN)/webhook-patch.yaml

render-local: certs
	$(KUBECTL) kustomize $(LOCAL_OVERLAY)

render-kind: certs-kind
	$(KUBECTL) kustomize $(KIND_OVERLAY)
