{{/*
The nodes' NATS URL. With nats.enabled, the Service of NATS's own chart
released with this one: its name is that chart's `nats.fullname` (the
release's name when it contains "nats", else `<release>-nats`; its
fullnameOverride/nameOverride read as it reads them), port 4222. Without,
nats.url, required.
*/}}
{{- define "ember.natsUrl" -}}
{{- if .Values.nats.enabled -}}
{{- $name := default "nats" .Values.nats.nameOverride -}}
{{- $full := printf "%s-%s" .Release.Name $name -}}
{{- if .Values.nats.fullnameOverride -}}
{{- $full = .Values.nats.fullnameOverride -}}
{{- else if contains $name .Release.Name -}}
{{- $full = .Release.Name -}}
{{- end -}}
nats://{{ $full | trunc 63 | trimSuffix "-" }}.{{ .Release.Namespace }}.svc:4222
{{- else -}}
{{- required "nats.url: an existing NATS with JetStream (or nats.enabled: true for NATS's own chart)" .Values.nats.url -}}
{{- end -}}
{{- end -}}
