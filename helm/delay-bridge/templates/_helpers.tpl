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
{{- $repository := required "image.repository is required: no registry publishes a delay-bridge image; build it (make dist), push it to a registry your cluster pulls from and set image.repository (docs/deploying.md, Publishing the image)" .Values.image.repository -}}
{{- printf "%s:%s" $repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/*
Name of the Secret with the passwords: the user's, or the one the chart creates.
*/}}
{{- define "delay-bridge.secretName" -}}
{{- default (include "delay-bridge.fullname" .) .Values.auth.existingSecret }}
{{- end }}

{{/*
Whether a librdkafka property's name marks it secret ("true" or ""): passwords, secrets,
passphrases, private keys, JAAS and OAUTHBEARER configs. A `<name>_file` is a path, not a secret.
*/}}
{{- define "delay-bridge.isSecretProperty" -}}
{{- if and (regexMatch "(?i)password|secret|passphrase|credential|jaas|oauthbearer\\.config|key\\.pem" .) (not (hasSuffix "_file" .)) }}true{{ end }}
{{- end }}

{{/*
The Secret key of a secret librdkafka property, (list role name): kafka.<role>.<name>, except the
SASL password of every client, which keeps its historic key kafka-password.
*/}}
{{- define "delay-bridge.propertySecretKey" -}}
{{- if eq (join "." .) "common.sasl.password" }}kafka-password{{ else }}kafka.{{ join "." . }}{{ end }}
{{- end }}

{{/*
config.redis.url split into the URL without its password ("url") and the password ("password").
*/}}
{{- define "delay-bridge.redisUrl" -}}
{{- $url := dig "redis" "url" "" .Values.config }}
{{- $parts := urlParse $url }}
{{- $user := $parts.userinfo }}
{{- $password := "" }}
{{- if contains ":" $parts.userinfo }}
{{- $user = regexReplaceAll ":.*$" $parts.userinfo "" }}
{{- $password = regexReplaceAll "^[^:]*:" $parts.userinfo "" }}
{{- if contains "%" $password }}
{{- fail "config.redis.url: its password is percent-encoded; give it unencoded in auth.redisPassword (or a Secret of yours) and leave it out of the URL" }}
{{- end }}
{{- $url = urlJoin (set (omit $parts "userinfo") "userinfo" $user) }}
{{- end }}
{{- toYaml (dict "url" $url "password" $password) }}
{{- end }}

{{/*
Every secret given inline, as Secret key → value: the auth.* passwords, those in config
(redis.password, redis.sentinel.password, the password in redis.url) and each librdkafka property
of config.kafka.common / consumer / producer whose name marks it secret (kafka.<role>.<name>).
None of them reaches the ConfigMap: they go into the chart's Secret.
*/}}
{{- define "delay-bridge.inlineSecrets" -}}
{{- $out := dict }}
{{- $kafka := default (dict) .Values.config.kafka }}
{{- $redis := default (dict) .Values.config.redis }}
{{- with .Values.auth.redisPassword | default $redis.password | default (include "delay-bridge.redisUrl" . | fromYaml).password }}
{{- $_ := set $out "redis-password" (toString .) }}
{{- end }}
{{- with .Values.auth.sentinelPassword | default (dig "sentinel" "password" "" $redis) }}
{{- $_ := set $out "sentinel-password" (toString .) }}
{{- end }}
{{- range $role := list "common" "consumer" "producer" }}
{{- range $name, $value := (index $kafka $role | default (dict)) }}
{{- if and (include "delay-bridge.isSecretProperty" $name) (toString $value) }}
{{- $_ := set $out (include "delay-bridge.propertySecretKey" (list $role $name)) (toString $value) }}
{{- end }}
{{- end }}
{{- end }}
{{- with .Values.auth.kafkaPassword }}
{{- $_ := set $out "kafka-password" (toString .) }}
{{- end }}
{{- with .Values.auth.consoleToken }}
{{- $_ := set $out "console-token" (toString .) }}
{{- end }}
{{- with .Values.auth.consoleReadToken }}
{{- $_ := set $out "console-read-token" (toString .) }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{/*
Key of the console's token in the mounted Secret ("" when none: writes are refused).
*/}}
{{- define "delay-bridge.consoleTokenKey" -}}
{{- if .Values.auth.existingSecret }}{{ .Values.auth.consoleTokenKey }}
{{- else if .Values.auth.consoleToken }}console-token{{ end }}
{{- end }}

{{/*
Key of the console's read token in the mounted Secret ("" when none: reads are open).
*/}}
{{- define "delay-bridge.consoleReadTokenKey" -}}
{{- if .Values.auth.existingSecret }}{{ .Values.auth.consoleReadTokenKey }}
{{- else if .Values.auth.consoleReadToken }}console-read-token{{ end }}
{{- end }}

{{/*
Key of the Kafka / Redis / Sentinel password in the mounted Secret ("" when none).
*/}}
{{- define "delay-bridge.passwordKey" -}}
{{- $ctx := index . 0 }}
{{- $name := index . 1 }}
{{- if $ctx.Values.auth.existingSecret }}{{ index $ctx.Values.auth (printf "%sPasswordKey" $name) }}
{{- else if hasKey (include "delay-bridge.inlineSecrets" $ctx | fromYaml) (printf "%s-password" $name) }}{{ $name }}-password{{ end }}
{{- end }}

{{/*
Whether the pod mounts the passwords Secret ("true" or "").
*/}}
{{- define "delay-bridge.hasSecret" -}}
{{- if or (include "delay-bridge.passwordKey" (list . "kafka")) (include "delay-bridge.passwordKey" (list . "redis")) (include "delay-bridge.passwordKey" (list . "sentinel")) (include "delay-bridge.consoleTokenKey" .) (include "delay-bridge.consoleReadTokenKey" .) (ne (include "delay-bridge.inlineSecrets" .) "{}") }}true{{ end }}
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
{{- $inline := include "delay-bridge.inlineSecrets" . | fromYaml }}
{{- $dir := "/var/run/secrets/delay-bridge" }}
{{- $config := deepCopy .Values.config }}
{{- $console := dict "enabled" .Values.console.enabled }}
{{- with include "delay-bridge.consoleTokenKey" . }}
{{- $_ := set $console "token_file" (printf "%s/%s" $dir .) }}
{{- end }}
{{- with include "delay-bridge.consoleReadTokenKey" . }}
{{- $_ := set $console "read_token_file" (printf "%s/%s" $dir .) }}
{{- end }}
{{- $_ := set $config "http" (dict "host" "0.0.0.0" "port" (int .Values.service.port) "console" $console) }}
{{- $kafka := default (dict) $config.kafka }}
{{- range $role := list "common" "consumer" "producer" }}
{{- $settings := dict }}
{{- range $name, $value := (index $kafka $role | default (dict)) }}
{{- if include "delay-bridge.isSecretProperty" $name }}
{{- $key := include "delay-bridge.propertySecretKey" (list $role $name) }}
{{- if hasKey $inline $key }}
{{- $_ := set $settings (printf "%s_file" $name) (printf "%s/%s" $dir $key) }}
{{- end }}
{{- else }}
{{- $_ := set $settings $name $value }}
{{- end }}
{{- end }}
{{- if and (eq $role "common") (include "delay-bridge.passwordKey" (list $ "kafka")) }}
{{- $_ := set $settings "sasl.password_file" (printf "%s/%s" $dir (include "delay-bridge.passwordKey" (list $ "kafka"))) }}
{{- end }}
{{- if and (eq $role "common") $.Values.tls.kafka.existingSecret }}
{{- $files := include "delay-bridge.tlsFiles" (dict "tls" $.Values.tls.kafka "dir" "/var/run/secrets/delay-bridge-tls/kafka" "keys" (list "ssl.ca.location" "ssl.certificate.location" "ssl.key.location")) | fromYaml }}
{{- $settings = merge $settings $files (dict "security.protocol" "SSL") }}
{{- end }}
{{- if or $settings (eq $role "common") (hasKey $kafka $role) }}
{{- $_ := set $kafka $role $settings }}
{{- end }}
{{- end }}
{{- $_ := set $config "kafka" $kafka }}
{{- $redis := omit (default (dict) $config.redis) "password" }}
{{- if $redis.url }}
{{- $_ := set $redis "url" (include "delay-bridge.redisUrl" . | fromYaml).url }}
{{- end }}
{{- if $redis.sentinel }}
{{- $_ := set $redis "sentinel" (omit $redis.sentinel "password") }}
{{- end }}
{{- with include "delay-bridge.passwordKey" (list . "redis") }}
{{- $_ := set $redis "password_file" (printf "%s/%s" $dir .) }}
{{- end }}
{{- with include "delay-bridge.passwordKey" (list . "sentinel") }}
{{- $sentinel := default (dict) $redis.sentinel }}
{{- $_ := set $sentinel "password_file" (printf "%s/%s" $dir .) }}
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

{{/*
A duration of the bridge's config in milliseconds: digits alone, or 1h30m, 250ms, ... (the
schema has checked the syntax).
*/}}
{{- define "delay-bridge.ms" -}}
{{- if kindIs "string" . }}
{{- $text := trim . }}
{{- if regexMatch "^[0-9]+$" $text }}{{ $text }}{{ else }}
{{- $unit := dict "ms" 1 "s" 1000 "m" 60000 "h" 3600000 "d" 86400000 }}
{{- $total := 0 }}
{{- range $part := regexFindAll "[0-9]+(ms|s|m|h|d)" $text -1 }}
{{- $total = add $total (mul (regexFind "^[0-9]+" $part | int64) (get $unit (regexReplaceAll "^[0-9]+" $part ""))) }}
{{- end }}
{{- $total }}
{{- end }}
{{- else }}{{ int64 . }}{{ end }}
{{- end }}

{{/*
check-config's rules that JSON Schema cannot say (values.schema.json has the others): those
across keys, and ranges of durations written with units (defaults are the bridge's own); and the
chart's own: no inline secret beside auth.existingSecret, http.port is service.port.
*/}}
{{- define "delay-bridge.validate" -}}
{{- $c := .Values.config }}
{{- $inline := include "delay-bridge.inlineSecrets" . | fromYaml }}
{{- if and .Values.auth.existingSecret $inline }}
{{- $named := dict "kafka-password" "auth.kafkaPassword or config.kafka.common.sasl.password" "redis-password" "auth.redisPassword, config.redis.password or the password in config.redis.url" "sentinel-password" "auth.sentinelPassword or config.redis.sentinel.password" "console-token" "auth.consoleToken" "console-read-token" "auth.consoleReadToken" }}
{{- $given := list }}
{{- range $key := keys $inline | sortAlpha }}
{{- $given = append $given (get $named $key | default (printf "config.%s" $key)) }}
{{- end }}
{{- include "delay-bridge.fail" (printf "%s: a secret given inline cannot be used with auth.existingSecret: put it in that Secret and name its key in auth.*PasswordKey (or point <property>_file at it)" (join "; " $given)) }}
{{- end }}
{{- with $c.http }}
{{- if and (hasKey . "port") (ne (int .port) (int $.Values.service.port)) }}
{{- include "delay-bridge.fail" (printf "config.http.port: %v differs from service.port (%v); the chart serves HTTP on service.port: set that alone" .port $.Values.service.port) }}
{{- end }}
{{- end }}
{{- $delay := dig "topics" "delay" (list "delay") $c }}
{{- $dlq := dig "topics" "dead_letter" "delay.dlq" $c }}
{{- if has $dlq $delay }}
{{- include "delay-bridge.fail" (printf "config.topics.dead_letter: must not be a delay topic (%s is one of config.topics.delay)" $dlq) }}
{{- end }}
{{- $journal := dig "topics" "journal" "<delay>.journal" $c | replace "<delay>" (first $delay) }}
{{- if and $journal (or (has $journal $delay) (eq $journal $dlq)) }}
{{- include "delay-bridge.fail" (printf "config.topics.journal: must be neither a delay topic nor the DLQ (%s)" $journal) }}
{{- end }}
{{- range $key := list "default_target" "dialect" }}
{{- range $topic, $_ := dig "topics" $key (dict) $c }}
{{- if not (has $topic $delay) }}
{{- include "delay-bridge.fail" (printf "config.topics.%s.%s: not one of config.topics.delay" $key $topic) }}
{{- end }}
{{- end }}
{{- end }}
{{- range $path := list "ingress.linger" "ingress.hold" "egress.tick" "egress.send_tick" "egress.ahead" }}
{{- $value := dig (splitList "." $path | first) (splitList "." $path | last) "" $c }}
{{- if and (ne (toString $value) "") (gt (include "delay-bridge.ms" $value | int64) 1000) }}
{{- include "delay-bridge.fail" (printf "config.%s: must be between 0 and 1s, got %v" $path $value) }}
{{- end }}
{{- end }}
{{- $lease := include "delay-bridge.ms" (dig "egress" "lease" "30s" $c) | int64 }}
{{- $ahead := dig "egress" "ahead" "100ms" $c }}
{{- if gt (mul (include "delay-bridge.ms" $ahead | int64) 10) $lease }}
{{- include "delay-bridge.fail" (printf "config.egress.ahead: must be at most a tenth of config.egress.lease (%v), got %v" (dig "egress" "lease" "30s" $c) $ahead) }}
{{- end }}
{{- $timeout := index (dig "kafka" "producer" (dict) $c) "delivery.timeout.ms" | default (index (dig "kafka" "common" (dict) $c) "delivery.timeout.ms") }}
{{- if and $timeout (ge (int64 $timeout) $lease) }}
{{- include "delay-bridge.fail" (printf "config.kafka.producer.delivery.timeout.ms: %v must be below config.egress.lease (%d ms), or a lease would expire while its record is in flight" $timeout $lease) }}
{{- end }}
{{- if eq (toString (dig "kafka" "static_membership" true $c)) "false" }}
{{- if dig "kafka" "group_instance_id" "" $c }}
{{- include "delay-bridge.fail" "config.kafka.static_membership: false, but config.kafka.group_instance_id names a static member" }}
{{- else if and $.Values.staticMembership (eq $.Values.workloadKind "StatefulSet") }}
{{- include "delay-bridge.fail" "config.kafka.static_membership: false, but staticMembership names each pod a static member (set staticMembership: false instead)" }}
{{- end }}
{{- end }}
{{- if and (dig "redis" "sentinel" "nodes" (list) $c) (dig "redis" "cluster" false $c) }}
{{- include "delay-bridge.fail" "config.redis.cluster and config.redis.sentinel.nodes: choose one (a cluster fails over by itself)" }}
{{- end }}
{{- end }}

{{/*
Stop the render with a message. Under `helm lint`, where fail only logs, the message is also
written out: templates/validate.yaml turns it into an object lint refuses.
*/}}
{{- define "delay-bridge.fail" -}}
{{- fail . }}{{ . }}
{{- end }}
