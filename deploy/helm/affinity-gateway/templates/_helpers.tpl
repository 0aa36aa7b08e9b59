{{- define "affinity-gateway.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "affinity-gateway.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "affinity-gateway.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "affinity-gateway.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* Names of the parts; the replicas' headless Service name is also the DNS name the gateways resolve. */}}
{{- define "affinity-gateway.redisName" -}}
{{- printf "%s-redis" (include "affinity-gateway.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "affinity-gateway.replicasName" -}}
{{- printf "%s-replica" (include "affinity-gateway.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of one component ("gateway", "redis", "replica"): selectors use only the stable ones. */}}
{{- define "affinity-gateway.selectorLabels" -}}
app.kubernetes.io/name: {{ include "affinity-gateway.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "affinity-gateway.labels" -}}
{{ include "affinity-gateway.selectorLabels" . }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: affinity-gateway
{{- end }}

{{- define "affinity-gateway.image" -}}
{{- printf "%s:%s" .image.repository (.image.tag | default .root.Chart.AppVersion) }}
{{- end }}

{{/* Contradictory values fail the render instead of deploying something else than asked. */}}
{{- define "affinity-gateway.validate" -}}
{{- if not (has .Values.replicas.mode (list "stub" "vllm")) }}
{{- fail (printf "replicas.mode: expected stub or vllm, got %q" .Values.replicas.mode) }}
{{- end }}
{{- if not (has .Values.discovery.mode (list "dns" "kubernetes")) }}
{{- fail (printf "discovery.mode: expected dns or kubernetes, got %q" .Values.discovery.mode) }}
{{- end }}
{{- if and (eq .Values.discovery.mode "kubernetes") (not .Values.serviceAccount.create) (not .Values.serviceAccount.name) }}
{{- fail "serviceAccount.name: set the existing account to use when serviceAccount.create is false" }}
{{- end }}
{{- if and .Values.redis.enabled .Values.externalRedis.existingSecret }}
{{- fail "set redis.enabled=false to use externalRedis.existingSecret (one Redis, not two)" }}
{{- end }}
{{- if ne (empty .Values.auth.existingSecret) (empty .Values.auth.files) }}
{{- fail "auth: set existingSecret and files together (the Secret, and which of its keys hold digests)" }}
{{- end }}
{{- range .Values.extraPools }}
{{- if eq .name $.Values.pool.name }}
{{- fail (printf "extraPools: %q is pool.name already" .name) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The gateways' ServiceAccount: only discovery through the Kubernetes API needs one. */}}
{{- define "affinity-gateway.serviceAccountName" -}}
{{- default (include "affinity-gateway.fullname" .) .Values.serviceAccount.name }}
{{- end }}

{{- define "affinity-gateway.redisUrlDir" -}}/var/run/secrets/affinity-gateway{{- end }}
{{- define "affinity-gateway.authDir" -}}/var/run/secrets/affinity-gateway-auth{{- end }}
{{- define "affinity-gateway.backendKeyDir" -}}/var/run/secrets/affinity-gateway-backend{{- end }}

{{/* The gateway's YAML config (config.example.yaml documents every key), then gateway.config over it. */}}
{{- define "affinity-gateway.config" -}}
{{- $kv := .Values.replicas.kvEvents }}
{{- $discovery := dict "port" 8000 "kv_events_port" $kv.port "kv_events_replay_port" $kv.replayPort }}
{{- if eq .Values.discovery.mode "kubernetes" }}
{{- $_ := set $discovery "kubernetes" (dict "service" (include "affinity-gateway.replicasName" .) "port_name" "http") }}
{{- else }}
{{- $_ := set $discovery "dns" (include "affinity-gateway.replicasName" .) }}
{{- $_ := set $discovery "interval_s" .Values.pool.discoveryIntervalS }}
{{- end }}
{{- /* KV events carry token ids: the stub's simulator tokenizer, or vLLM's own /tokenize */}}
{{- $prefix := dict "tokenizer" (ternary "sim" "replica" (eq .Values.replicas.mode "stub")) "block_tokens" .Values.pool.blockTokens }}
{{- $pool := dict "discovery" $discovery "routing" (dict "policy" .Values.pool.policy "prefix" $prefix) }}
{{- if .Values.backendKey.existingSecret }}
{{- $_ := set $pool "api_key_file" (printf "%s/%s" (include "affinity-gateway.backendKeyDir" .) .Values.backendKey.secretKey) }}
{{- end }}
{{- $pools := dict .Values.pool.name $pool }}
{{- range .Values.extraPools }}
{{- $extra := dict "port" (.port | default 8000) "dns" .service "interval_s" $.Values.pool.discoveryIntervalS }}
{{- with .kvEvents }}
{{- $_ := set $extra "kv_events_port" .port }}
{{- $_ := set $extra "kv_events_replay_port" .replayPort }}
{{- end }}
{{- $extraPrefix := dict "block_tokens" (.blockTokens | default 16) }}
{{- with .tokenizer }}
{{- $_ := set $extraPrefix "tokenizer" . }}
{{- end }}
{{- $_ := set $pools .name (dict "discovery" $extra "routing" (dict "policy" (.policy | default "prefix_affinity") "prefix" $extraPrefix)) }}
{{- end }}
{{- $redis := dict }}
{{- if .Values.redis.enabled }}
{{- $_ := set $redis "url" (printf "redis://%s:6379/0" (include "affinity-gateway.redisName" .)) }}
{{- else if .Values.externalRedis.existingSecret }}
{{- $_ := set $redis "url_file" (printf "%s/%s" (include "affinity-gateway.redisUrlDir" .) .Values.externalRedis.secretKey) }}
{{- end }}
{{- $config := dict
  "pools" $pools
  "health" (dict "interval_s" 2.0)
  "load" (dict "interval_s" 0.5)
  "logging" (dict "level" .Values.gateway.logLevel "format" "json")
  "shutdown" (dict "ready_delay_s" .Values.gateway.shutdown.readyDelayS "grace_s" .Values.gateway.shutdown.graceS) }}
{{- if .Values.auth.existingSecret }}
{{- $keys := list }}
{{- range .Values.auth.files }}
{{- $entry := dict "sha256_file" (printf "%s/%s" (include "affinity-gateway.authDir" $) .key) "tenant" (.tenant | default "") "admin" (.admin | default false) }}
{{- with .requestsPerMinute }}{{ $_ := set $entry "requests_per_minute" . }}{{ end }}
{{- with .tokensPerMinute }}{{ $_ := set $entry "tokens_per_minute" . }}{{ end }}
{{- $keys = append $keys $entry }}
{{- end }}
{{- $_ := set $config "auth" (dict "keys" $keys) }}
{{- end }}
{{- if .Values.tracing.enabled }}
{{- $t := .Values.tracing }}
{{- $_ := set $config "tracing" (dict "enabled" true "endpoint" $t.endpoint "service_name" $t.serviceName "sampling_ratio" $t.samplingRatio) }}
{{- end }}
{{- if $redis }}
{{- $_ := set $config "redis" $redis }}
{{- $_ := set $config "index" (dict "store" "redis") }}
{{- end }}
{{- toYaml (mergeOverwrite $config (deepCopy .Values.gateway.config)) }}
{{- end }}
