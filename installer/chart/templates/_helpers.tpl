{{- define "stack.labels" -}}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: openshell
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Which pieces render, from the mode. One place, so the templates cannot disagree. */}}
{{- define "stack.inCluster" -}}
{{- and .Values.runtime.sandbox.enabled .Values.runtime.sandbox.inCluster.enabled -}}
{{- end -}}
{{- define "stack.external" -}}
{{- and .Values.runtime.sandbox.enabled .Values.runtime.sandbox.external.enabled -}}
{{- end -}}

{{/* The gateway subchart's context, with the values the parent owns filled in. */}}
{{- define "stack.gateway" -}}
{{- $sub := .Subcharts.openshell -}}
{{- $vals := deepCopy $sub.Values -}}
{{- $_ := set $vals "hostGatewayIP" .Values.runtime.sandbox.hostGatewayIP -}}
{{- include "openshell.gateway" (dict "Values" $vals "Release" $sub.Release "Chart" $sub.Chart "Capabilities" $sub.Capabilities) -}}
{{- end -}}

{{/* Where the runtime reaches the gateway. */}}
{{- define "stack.gatewayEndpoint" -}}
{{- if eq (include "stack.external" .) "true" -}}
{{- .Values.runtime.sandbox.external.endpoint -}}
{{- else -}}
{{- include "openshell.grpcEndpoint" .Subcharts.openshell -}}
{{- end -}}
{{- end -}}

{{/* Whether the runtime's endpoint uses TLS, so it needs the client certificate. */}}
{{- define "stack.gatewayTLS" -}}
{{- hasPrefix "https://" (include "stack.gatewayEndpoint" .) -}}
{{- end -}}

{{- define "stack.sandboxNamespace" -}}{{ .Subcharts.openshell.Values.sandboxNamespace }}{{- end -}}
{{- define "stack.gatewayName" -}}{{ include "openshell.fullname" .Subcharts.openshell }}{{- end -}}
