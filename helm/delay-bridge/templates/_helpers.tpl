{{/*
Chart name, truncated to 63 characters (a DNS label).
*/}}
{{- define "delay-bridge.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: release-chart, or the release name alone when it already holds the chart name.
*/}}
{{- define "delay-bridge.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Chart name and version, for the helm.sh/chart label.
*/}}
{{- define "delay-bridge.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels of every resource.
*/}}
{{- define "delay-bridge.labels" -}}
helm.sh/chart: {{ include "delay-bridge.chart" . }}
{{ include "delay-bridge.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: bridge
app.kubernetes.io/part-of: delay-bridge
{{- end }}

{{/*
Selector labels: stable across upgrades, so never the chart version.
*/}}
{{- define "delay-bridge.selectorLabels" -}}
app.kubernetes.io/name: {{ include "delay-bridge.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
ServiceAccount name.
*/}}
{{- define "delay-bridge.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "delay-bridge.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Image reference.
*/}}
{{- define "delay-bridge.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/*
Name of the Secret with the passwords: the user's, or the one the chart creates.
*/}}
{{- define "delay-bridge.secretName" -}}
{{- default (include "delay-bridge.fullname" .) .Values.auth.existingSecret }}
{{- end }}

{{/*
Key of the Kafka / Redis password in that Secret ("" when none).
*/}}
{{- define "delay-bridge.kafkaPasswordKey" -}}
{{- if .Values.auth.existingSecret }}{{ .Values.auth.kafkaPasswordKey }}{{ else if .Values.auth.kafkaPassword }}kafka-password{{ end }}
{{- end }}
{{- define "delay-bridge.redisPasswordKey" -}}
{{- if .Values.auth.existingSecret }}{{ .Values.auth.redisPasswordKey }}{{ else if .Values.auth.redisPassword }}redis-password{{ end }}
{{- end }}

{{/*
The bridge's YAML config: values.config, with the HTTP port of the Service and the password
files of the mounted Secret.
*/}}
{{- define "delay-bridge.config" -}}
{{- $config := deepCopy .Values.config }}
{{- $_ := set $config "http" (dict "host" "0.0.0.0" "port" (int .Values.service.port)) }}
{{- $kafka := default (dict) $config.kafka }}
{{- $common := default (dict) $kafka.common }}
{{- if include "delay-bridge.kafkaPasswordKey" . }}
{{- $_ := set $common "sasl.password_file" (printf "/var/run/secrets/delay-bridge/%s" (include "delay-bridge.kafkaPasswordKey" .)) }}
{{- end }}
{{- $_ := set $kafka "common" $common }}
{{- $_ := set $config "kafka" $kafka }}
{{- if include "delay-bridge.redisPasswordKey" . }}
{{- $redis := default (dict) $config.redis }}
{{- $_ := set $redis "password_file" (printf "/var/run/secrets/delay-bridge/%s" (include "delay-bridge.redisPasswordKey" .)) }}
{{- $_ := set $config "redis" $redis }}
{{- end }}
{{- toYaml $config }}
{{- end }}
