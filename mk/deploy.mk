# Certificates and kustomize rendering. Included from the main Makefile.
#
#   make certs        webhook CA + serving cert (SANs: service names + 127.0.0.1) into
#                     $(RUN_DIR)/certs, and kustomize/overlays/local/generated/webhook-patch.yaml
#   make render-local / render-kind / render-cert-manager   print the rendered overlay
#                     (kind and cert-manager need nothing generated: cert-manager issues
#                     their certificate in the cluster, components/cert-manager)
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
CERT_MANAGER_OVERLAY := kustomize/overlays/cert-manager

.PHONY: certs render-local render-kind render-cert-manager

certs:
	$(PYTHON) -m slurmgate.certs webhook --out $(CERTS_DIR) \
	  --namespace $(WEBHOOK_NAMESPACE) --service $(WEBHOOK_SERVICE) --ip 127.0.0.1 \
	  --days $(CERT_DAYS) --renew-before-days $(CERT_RENEW_BEFORE_DAYS) \
	  --secret-manifest $(CERTS_DIR)/secret.yaml --ca-bundle-out $(CERTS_DIR)/ca-bundle.b64
	$(PYTHON) -m slurmgate.certs webhook-patch --ca-bundle-file $(CERTS_DIR)/ca-bundle.b64 \
	  --url $(LOCAL_WEBHOOK_URL) --out $(LOCAL_OVERLAY)/generated/webhook-patch.yaml

render-local: certs
	$(KUBECTL) kustomize $(LOCAL_OVERLAY)

render-kind:
	$(KUBECTL) kustomize $(KIND_OVERLAY)

render-cert-manager:
	$(KUBECTL) kustomize $(CERT_MANAGER_OVERLAY)
