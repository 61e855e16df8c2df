{{- define "headroom.name" -}}kube-headroom{{- end -}}
{{- define "headroom.fullname" -}}{{ .Release.Name | trunc 40 | trimSuffix "-" }}{{- end -}}
{{- define "headroom.labels" -}}
app.kubernetes.io/name: kube-headroom
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}
{{- define "headroom.selector" -}}
app.kubernetes.io/name: kube-headroom
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- define "headroom.webhookSelector" -}}
app.kubernetes.io/name: kube-headroom-webhook
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- define "headroom.webhookLabels" -}}
{{ include "headroom.webhookSelector" . }}
app.kubernetes.io/component: webhook
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}
{{- define "headroom.webhookSecret" -}}{{ include "headroom.fullname" . }}-webhook-tls{{- end -}}
