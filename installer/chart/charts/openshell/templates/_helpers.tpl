{{/* Names. The gateway's own objects share one name: the Service name sandboxes dial. */}}
{{- define "openshell.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "openshell.labels" -}}
app.kubernetes.io/name: openshell-gateway
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: gateway
app.kubernetes.io/part-of: openshell
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "openshell.selectorLabels" -}}
app.kubernetes.io/name: openshell-gateway
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The URL sandboxes dial: the Service's fully qualified cluster name on 8080, with TLS
unless tls.enabled is false. */}}
{{- define "openshell.grpcEndpoint" -}}
{{- if .Values.grpcEndpoint -}}
{{- .Values.grpcEndpoint -}}
{{- else -}}
{{- printf "%s://%s.%s.svc.cluster.local:8080" (ternary "https" "http" .Values.tls.enabled) (include "openshell.fullname" .) .Release.Namespace -}}
{{- end -}}
{{- end -}}
