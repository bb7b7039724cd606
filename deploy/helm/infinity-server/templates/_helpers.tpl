{{/* The chart's name, and the release's full name (both DNS labels). */}}
{{- define "infinity.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "infinity.fullname" -}}
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

{{/* A group merged over groupDefaults, as YAML: (dict "root" $ "group" .) -> include | fromYaml. */}}
{{- define "infinity.group" -}}
{{- toYaml (mergeOverwrite (deepCopy .root.Values.groupDefaults) (deepCopy .group)) }}
{{- end }}

{{/* The name of a group's objects: <fullname>-<group>. Takes (dict "root" $ "group" $g). */}}
{{- define "infinity.groupFullname" -}}
{{- printf "%s-%s" (include "infinity.fullname" .root) .group.name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "infinity.selectorLabels" -}}
app.kubernetes.io/name: {{ include "infinity.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .group.name }}
{{- end }}

{{- define "infinity.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "infinity.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end }}

{{- define "infinity.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "infinity.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "infinity.image" -}}
{{- $image := mergeOverwrite (deepCopy .root.Values.image) (deepCopy (.group.image | default dict)) }}
{{- printf "%s:%s" $image.repository (default (printf "%s-cpu" .root.Chart.AppVersion) $image.tag) }}
{{- end }}

{{- define "infinity.apiKeysSecret" -}}
{{- if .Values.apiKeys.existingSecret }}
{{- .Values.apiKeys.existingSecret }}
{{- else if .Values.apiKeys.keys }}
{{- printf "%s-api-keys" (include "infinity.fullname" .) }}
{{- end }}
{{- end }}

{{/*
The group's models.yaml: the chart-wide `server` section, the group's own, then what the chart owns
(port, drain grace, memory budget); the group's models and registry limits.
*/}}
{{- define "infinity.config" -}}
{{- $g := .group }}
{{- $owned := dict "port" (int .root.Values.service.port) "graceful_timeout" .root.Values.shutdown.gracefulTimeoutSeconds "memory_budget" $g.memoryBudget }}
{{- $server := mergeOverwrite (deepCopy (.root.Values.server | default dict)) (deepCopy ($g.server | default dict)) $owned }}
{{- $config := dict "server" $server "models" $g.models }}
{{- if $g.registry }}
{{- $_ := set $config "registry" $g.registry }}
{{- end }}
{{- toYaml $config }}
{{- end }}

{{- define "infinity.terminationGracePeriod" -}}
{{- $s := .Values.shutdown }}
{{- if $s.terminationGracePeriodSeconds }}
{{- $s.terminationGracePeriodSeconds }}
{{- else }}
{{- add (int $s.preStopSleepSeconds) (int (ceil $s.gracefulTimeoutSeconds)) 10 }}
{{- end }}
{{- end }}

{{/* The gate's objects: <fullname>-gate. */}}
{{- define "infinity.gateFullname" -}}
{{- printf "%s-gate" (include "infinity.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The groups that scale to zero, merged over groupDefaults, as a YAML list under `groups`. */}}
{{- define "infinity.zeroGroups" -}}
{{- $found := list }}
{{- range .Values.groups }}
{{- $g := include "infinity.group" (dict "root" $ "group" .) | fromYaml }}
{{- if $g.autoscaling.scaleToZero.enabled }}
{{- $found = append $found $g }}
{{- end }}
{{- end }}
{{- toYaml (dict "groups" $found) }}
{{- end }}

{{/* The gate's configuration (infinity_server.gate): one entry per group that scales to zero. */}}
{{- define "infinity.gateConfig" -}}
{{- $groups := list }}
{{- range (include "infinity.zeroGroups" . | fromYaml).groups }}
{{- $ctx := dict "root" $ "group" . }}
{{- $url := printf "http://%s:%d" (include "infinity.groupFullname" $ctx) (int $.Values.service.port) }}
{{- $models := list }}
{{- range .models }}
{{- $models = append $models .name }}
{{- end }}
{{- $groups = append $groups (dict "name" .name "url" $url "models" $models) }}
{{- end }}
{{- $gate := .Values.gate }}
{{- $config := dict "port" (int .Values.service.port) "header" .Values.gateway.header "wait_seconds" $gate.waitSeconds "retry_after" (int $gate.retryAfter) "max_waiting" (int $gate.maxWaiting) "max_body_bytes" (int $gate.maxBodyBytes) "max_held_bytes" (int $gate.maxHeldBytes) "groups" $groups }}
{{- toYaml (dict "gate" $config) }}
{{- end }}
