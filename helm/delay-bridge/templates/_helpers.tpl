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
A password given inline, in auth or (never rendered into the ConfigMap) in config: it goes into
the chart's Secret.
*/}}
{{- define "delay-bridge.kafkaPassword" -}}
{{- .Values.auth.kafkaPassword | default (index (dig "kafka" "common" dict .Values.config) "sasl.password" | default "") }}
{{- end }}
{{- define "delay-bridge.redisPassword" -}}
{{- .Values.auth.redisPassword | default (dig "redis" "password" "" .Values.config) }}
{{- end }}
{{- define "delay-bridge.sentinelPassword" -}}
{{- .Values.auth.sentinelPassword | default (dig "redis" "sentinel" "password" "" .Values.config) }}
{{- end }}

{{/*
Key of the Kafka / Redis / Sentinel password in that Secret ("" when none).
*/}}
{{- define "delay-bridge.kafkaPasswordKey" -}}
{{- if .Values.auth.existingSecret }}{{ .Values.auth.kafkaPasswordKey }}{{ else if include "delay-bridge.kafkaPassword" . }}kafka-password{{ end }}
{{- end }}
{{- define "delay-bridge.redisPasswordKey" -}}
{{- if .Values.auth.existingSecret }}{{ .Values.auth.redisPasswordKey }}{{ else if include "delay-bridge.redisPassword" . }}redis-password{{ end }}
{{- end }}
{{- define "delay-bridge.sentinelPasswordKey" -}}
{{- if .Values.auth.existingSecret }}{{ .Values.auth.sentinelPasswordKey }}{{ else if include "delay-bridge.sentinelPassword" . }}sentinel-password{{ end }}
{{- end }}

{{/*
Whether the pod mounts the passwords Secret ("true" or "").
*/}}
{{- define "delay-bridge.hasSecret" -}}
{{- if or (include "delay-bridge.kafkaPasswordKey" .) (include "delay-bridge.redisPasswordKey" .) (include "delay-bridge.sentinelPasswordKey" .) }}true{{ end }}
{{- end }}

{{/*
The config keys of a TLS Secret's files: (dict "tls" .Values.tls.x "dir" mount "keys" (list ca cert key)).
*/}}
{{- define "delay-bridge.tlsFiles" -}}
{{- $out := dict }}
{{- range $i, $value := list .tls.caKey .tls.certKey .tls.keyKey }}
{{- if $value }}
{{- $_ := set $out (index $.keys $i) (printf "%s/%s" $.dir $value) }}
{{- end }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{/*
The bridge's YAML config: values.config, with the HTTP port of the Service and the password
files of the mounted Secret.
*/}}
{{- define "delay-bridge.config" -}}
{{- if and .Values.auth.existingSecret (or (include "delay-bridge.kafkaPassword" .) (include "delay-bridge.redisPassword" .) (include "delay-bridge.sentinelPassword" .)) }}
{{- fail "a password given inline (auth.*Password, config.redis.password, config.redis.sentinel.password, config.kafka.common.sasl.password) cannot be used with auth.existingSecret: put it in that Secret and name its key in auth.*PasswordKey" }}
{{- end }}
{{- $config := deepCopy .Values.config }}
{{- $_ := set $config "http" (dict "host" "0.0.0.0" "port" (int .Values.service.port)) }}
{{- $kafka := default (dict) $config.kafka }}
{{- $common := omit (default (dict) $kafka.common) "sasl.password" }}
{{- if include "delay-bridge.kafkaPasswordKey" . }}
{{- $_ := set $common "sasl.password_file" (printf "/var/run/secrets/delay-bridge/%s" (include "delay-bridge.kafkaPasswordKey" .)) }}
{{- end }}
{{- with .Values.tls.kafka }}
{{- if .existingSecret }}
{{- $files := include "delay-bridge.tlsFiles" (dict "tls" . "dir" "/var/run/secrets/delay-bridge-tls/kafka" "keys" (list "ssl.ca.location" "ssl.certificate.location" "ssl.key.location")) | fromYaml }}
{{- $common = merge $common $files (dict "security.protocol" "SSL") }}
{{- end }}
{{- end }}
{{- $_ := set $kafka "common" $common }}
{{- $_ := set $config "kafka" $kafka }}
{{- $redis := omit (default (dict) $config.redis) "password" }}
{{- if $redis.sentinel }}
{{- $_ := set $redis "sentinel" (omit $redis.sentinel "password") }}
{{- end }}
{{- if include "delay-bridge.redisPasswordKey" . }}
{{- $_ := set $redis "password_file" (printf "/var/run/secrets/delay-bridge/%s" (include "delay-bridge.redisPasswordKey" .)) }}
{{- end }}
{{- if include "delay-bridge.sentinelPasswordKey" . }}
{{- $sentinel := default (dict) $redis.sentinel }}
{{- $_ := set $sentinel "password_file" (printf "/var/run/secrets/delay-bridge/%s" (include "delay-bridge.sentinelPasswordKey" .)) }}
{{- $_ := set $redis "sentinel" $sentinel }}
{{- end }}
{{- with .Values.tls.redis }}
{{- if .existingSecret }}
{{- $files := include "delay-bridge.tlsFiles" (dict "tls" . "dir" "/var/run/secrets/delay-bridge-tls/redis" "keys" (list "ca_file" "cert_file" "key_file")) | fromYaml }}
{{- $_ := set $redis "tls" (merge (default (dict) $redis.tls) $files) }}
{{- end }}
{{- end }}
{{- $_ := set $config "redis" $redis }}
{{- toYaml $config }}
{{- end }}
