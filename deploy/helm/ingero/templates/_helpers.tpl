{{/* Chart name, truncated to the 63 characters a DNS label allows. */}}
{{- define "ingero.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-qualified name: "<release>" when it already contains the chart name. */}}
{{- define "ingero.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "ingero.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "ingero.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ingero
{{- end }}

{{- define "ingero.agent.selector" -}}
app.kubernetes.io/name: {{ include "ingero.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: agent
{{- end }}

{{- define "ingero.aggregator.selector" -}}
app.kubernetes.io/name: {{ include "ingero.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: aggregator
{{- end }}

{{- define "ingero.agent.fullname" -}}
{{- printf "%s-agent" (include "ingero.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ingero.aggregator.fullname" -}}
{{- printf "%s-aggregator" (include "ingero.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ingero.tokenSecret" -}}
{{- default (printf "%s-token" (include "ingero.fullname" .)) .Values.auth.existingSecret }}
{{- end }}

{{/* image reference: repository/name:tag (tag defaults to appVersion). */}}
{{- define "ingero.image" -}}
{{- $root := index . 0 -}}
{{- $name := index . 1 -}}
{{- printf "%s/%s:%s" $root.Values.image.repository $name (default $root.Chart.AppVersion $root.Values.image.tag) }}
{{- end }}

{{/* Refuses TLS settings that cannot work. */}}
{{- define "ingero.tls.check" -}}
{{- if and .Values.tls.mutual.enabled (not .Values.tls.enabled) }}
{{- fail "tls.mutual.enabled needs tls.enabled (mutual TLS is TLS with client certificates)" }}
{{- end }}
{{- end }}

{{/* The Secret with the CA the agents trust for the aggregator's certificate. */}}
{{- define "ingero.tls.caSecret" -}}
{{- default .Values.tls.serverSecret .Values.tls.caSecret -}}
{{- end }}

{{/* The Secret with the CA the aggregator trusts for agents' certificates. */}}
{{- define "ingero.tls.clientCASecret" -}}
{{- default .Values.tls.mutual.agentSecret .Values.tls.mutual.clientCASecret -}}
{{- end }}

{{/* The headless Service that gives each aggregator replica a DNS name. */}}
{{- define "ingero.aggregator.headless" -}}
{{- printf "%s-headless" (include "ingero.aggregator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* gRPC scheme of the aggregator. */}}
{{- define "ingero.aggregator.scheme" -}}
{{- if .Values.tls.enabled }}https{{ else }}http{{ end }}
{{- end }}

{{/* Every aggregator replica's gRPC URL, comma-separated, in ordinal order
(the same list for the replicas' --replicas and the agents' --aggregator). */}}
{{- define "ingero.aggregator.replicaURLs" -}}
{{- $urls := list }}
{{- $full := include "ingero.aggregator.fullname" . }}
{{- $headless := include "ingero.aggregator.headless" . }}
{{- $scheme := include "ingero.aggregator.scheme" . }}
{{- range $i := until (int .Values.aggregator.replicas) }}
{{- $urls = append $urls (printf "%s://%s-%d.%s.%s.svc:%v" $scheme $full $i $headless $.Release.Namespace $.Values.aggregator.grpcPort) }}
{{- end }}
{{- join "," $urls }}
{{- end }}

{{/* Several replicas share one store: a PVC per pod cannot be shared. */}}
{{- define "ingero.replicas.check" -}}
{{- if and (gt (int .Values.aggregator.replicas) 1) (ne .Values.aggregator.storage.type "s3") }}
{{- fail "aggregator.replicas > 1 needs aggregator.storage.type=s3: replicas share one store (each pod's PVC only holds its write-ahead log)" }}
{{- end }}
{{- end }}
