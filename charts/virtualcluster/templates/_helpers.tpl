{{/* Chart name. */}}
{{- define "virtualcluster.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-qualified name; component objects append -vc-manager, -syncer, -vn-agent. */}}
{{- define "virtualcluster.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 49 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 49 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 49 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Name of a component's objects. Usage: include "virtualcluster.componentName" (list . "vc-manager") */}}
{{- define "virtualcluster.componentName" -}}
{{- printf "%s-%s" (include "virtualcluster.fullname" (index . 0)) (index . 1) }}
{{- end }}

{{- define "virtualcluster.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "virtualcluster.labels" -}}
helm.sh/chart: {{ include "virtualcluster.chart" . }}
{{ include "virtualcluster.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: virtualcluster
{{- end }}

{{- define "virtualcluster.selectorLabels" -}}
app.kubernetes.io/name: {{ include "virtualcluster.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of a component's objects. Usage: include "virtualcluster.componentLabels" (list . "syncer") */}}
{{- define "virtualcluster.componentLabels" -}}
{{ include "virtualcluster.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "virtualcluster.componentSelectorLabels" -}}
{{ include "virtualcluster.selectorLabels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/* ServiceAccount of a component. Usage: include "virtualcluster.serviceAccountName" (list . "syncer" .Values.syncer) */}}
{{- define "virtualcluster.serviceAccountName" -}}
{{- $values := index . 2 }}
{{- if $values.serviceAccount.create }}
{{- default (include "virtualcluster.componentName" (list (index . 0) (index . 1))) $values.serviceAccount.name }}
{{- else }}
{{- default "default" $values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
<registry>/<repository>:<tag>[@<digest>]. image.registry is required: no images are published.
Usage: include "virtualcluster.image" (list . .Values.syncer)
*/}}
{{- define "virtualcluster.image" -}}
{{- $root := index . 0 }}
{{- $values := index . 1 }}
{{- $tag := toString (default (default $root.Chart.AppVersion $root.Values.image.tag) $values.image.tag) }}
{{- $registry := trimSuffix "/" (toString $root.Values.image.registry) }}
{{- if not $registry }}
{{- fail "image.registry is required: no images of virtualcluster-rs are published. Build the Dockerfile's five targets (vc-manager, syncer, vn-agent, vc-dns, kubectl-vc), push them, and set image.registry to the registry and path that holds them (e.g. --set image.registry=registry.example.com/platform); see charts/virtualcluster/README.md, \"Images\"" }}
{{- end }}
{{- $digest := toString ($values.image.digest | default "") }}
{{- if and $digest (not (regexMatch "^sha256:[a-f0-9]{64}$" $digest)) }}
{{- fail (printf "%s.image.digest must be sha256:<64 hex digits>, not %s" $values.image.repository $digest) }}
{{- end }}
{{- printf "%s/%s:%s" $registry $values.image.repository $tag }}{{ with $digest }}@{{ . }}{{ end }}
{{- end }}

{{/*
"true" or "false": whether a component elects a leader. auto means "when there is more than one replica"; a
single replica without election runs with the Recreate strategy, so that an update never runs two.
Usage: include "virtualcluster.leaderElect" (list "syncer" .Values.syncer)
*/}}
{{- define "virtualcluster.leaderElect" -}}
{{- $component := index . 0 }}
{{- $values := index . 1 }}
{{- $setting := $values.leaderElection.enabled }}
{{- $replicas := int $values.replicas }}
{{- if or (kindIs "invalid" $setting) (eq (toString $setting) "auto") (eq (toString $setting) "") }}
{{- if gt $replicas 1 }}true{{ else }}false{{ end }}
{{- else if eq (toString $setting) "true" }}true
{{- else if eq (toString $setting) "false" }}
{{- if gt $replicas 1 }}
{{- fail (printf "%s: %d replicas need leader election (leaderElection.enabled: auto or true), or they would all write" $component $replicas) }}
{{- end }}false
{{- else }}
{{- fail (printf "%s.leaderElection.enabled must be auto, true or false, not %v" $component $setting) }}
{{- end }}
{{- end }}

{{/*
Whether the syncer shards tenants across its replicas: "true" or "false". auto: when replicas > 1. Sharded
replicas are all active (each syncs the tenants whose Lease it holds), so whole-process leader election is
off then.
*/}}
{{- define "virtualcluster.syncerShards" -}}
{{- $values := .Values.syncer }}
{{- $setting := (($values.shards | default dict).enabled) }}
{{- if or (kindIs "invalid" $setting) (eq (toString $setting) "auto") (eq (toString $setting) "") }}
{{- if gt (int $values.replicas) 1 }}true{{ else }}false{{ end }}
{{- else if or (eq (toString $setting) "true") (eq (toString $setting) "false") }}{{ toString $setting }}
{{- else }}
{{- fail (printf "syncer.shards.enabled must be auto, true or false, not %v" $setting) }}
{{- end }}
{{- end }}

{{/* The log format flag, checked. */}}
{{- define "virtualcluster.logFormat" -}}
{{- if not (has .Values.logFormat (list "text" "json")) }}
{{- fail (printf "logFormat must be text or json, not %v" .Values.logFormat) }}
{{- end }}
{{- printf "--log-format=%s" .Values.logFormat }}
{{- end }}

{{/* Pod name and namespace from the downward API: the Lease holder's identity and the Lease namespace. */}}
{{- define "virtualcluster.podIdentityEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- end }}

{{/* Liveness and readiness on the admin port. Usage: include "virtualcluster.probes" "/readyz" */}}
{{- define "virtualcluster.probes" -}}
livenessProbe:
  httpGet:
    path: /healthz
    port: admin
  initialDelaySeconds: 5
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: 3
readinessProbe:
  httpGet:
    path: {{ . }}
    port: admin
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 3
{{- end }}

{{/* Scheduling, pull secrets and priority of a pod. Usage: include "virtualcluster.podPlacement" (list . .Values.syncer) */}}
{{- define "virtualcluster.podPlacement" -}}
{{- $root := index . 0 }}
{{- $values := index . 1 }}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The ConfigMap vc-manager keeps the tenants' public kubelet-client CAs in and vn-agent reads (vn-agent then reads no Secret). */}}
{{- define "virtualcluster.caBundleName" -}}
{{ include "virtualcluster.fullname" . }}-kubelet-client-cas
{{- end }}

{{/* The claim the snapshot scheduler writes into: persistence.existingClaim, else the chart's <fullname>-snapshots. */}}
{{- define "virtualcluster.snapshotsClaimName" -}}
{{- default (include "virtualcluster.componentName" (list . "snapshots")) .Values.snapshots.persistence.existingClaim }}
{{- end }}

{{/*
A component's PodDisruptionBudget, when its podDisruptionBudget.enabled (auto: replicas > 1) asks for one.
Usage: include "virtualcluster.podDisruptionBudget" (list . "syncer" .Values.syncer)
*/}}
{{- define "virtualcluster.podDisruptionBudget" -}}
{{- $root := index . 0 }}
{{- $component := index . 1 }}
{{- $values := index . 2 }}
{{- $budget := $values.podDisruptionBudget }}
{{- $setting := toString $budget.enabled }}
{{- $replicas := int $values.replicas }}
{{- $on := or (eq $setting "true") (and (eq $setting "auto") (gt $replicas 1)) }}
{{- if and $on $values.enabled }}
{{- $useMin := not (kindIs "invalid" $budget.minAvailable) }}
{{- if and (not $useMin) (kindIs "invalid" $budget.maxUnavailable) }}
{{- fail (printf "%s.podDisruptionBudget: set maxUnavailable or minAvailable" $component) }}
{{- end }}
{{- if and $useMin (not (kindIs "string" $budget.minAvailable)) (ge (int $budget.minAvailable) $replicas) }}
{{- fail (printf "%s.podDisruptionBudget.minAvailable %v with %d replica(s) allows no eviction: node drains would never finish" $component $budget.minAvailable $replicas) }}
{{- end }}
{{- if and (not $useMin) (not (kindIs "string" $budget.maxUnavailable)) (lt (int $budget.maxUnavailable) 1) }}
{{- fail (printf "%s.podDisruptionBudget.maxUnavailable 0 allows no eviction: node drains would never finish" $component) }}
{{- end }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "virtualcluster.componentName" (list $root $component) }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "virtualcluster.componentLabels" (list $root $component) | nindent 4 }}
spec:
  {{- if $useMin }}
  minAvailable: {{ $budget.minAvailable }}
  {{- else }}
  maxUnavailable: {{ $budget.maxUnavailable }}
  {{- end }}
  selector:
    matchLabels:
      {{- include "virtualcluster.componentSelectorLabels" (list $root $component) | nindent 6 }}
{{- end }}
{{- end }}

{{/*
The ingress rule admitting a component's admin port: the release namespace, networkPolicy.metricsFromNamespaces
and networkPolicy.allowCidrs. Usage: include "virtualcluster.adminIngress" (list . 8080)
*/}}
{{- define "virtualcluster.adminIngress" -}}
{{- $root := index . 0 }}
{{- $port := index . 1 -}}
- from:
    - namespaceSelector:
        matchLabels:
          kubernetes.io/metadata.name: {{ $root.Release.Namespace }}
    {{- range $root.Values.networkPolicy.metricsFromNamespaces }}
    - namespaceSelector:
        matchLabels:
          kubernetes.io/metadata.name: {{ . }}
    {{- end }}
    {{- range $root.Values.networkPolicy.allowCidrs }}
    - ipBlock:
        cidr: {{ . }}
    {{- end }}
  ports:
    - port: {{ $port }}
      protocol: TCP
{{- end }}

{{/*
A component's NetworkPolicy: only its admin port, from where virtualcluster.adminIngress says.
Usage: include "virtualcluster.adminNetworkPolicy" (list . "syncer" .Values.syncer.adminPort)
*/}}
{{- define "virtualcluster.adminNetworkPolicy" -}}
{{- $root := index . 0 }}
{{- $component := index . 1 }}
{{- $port := index . 2 }}
---
# Ingress to {{ $component }}: its admin port (/metrics names tenants; /healthz, /readyz) from the release
# namespace, networkPolicy.metricsFromNamespaces and networkPolicy.allowCidrs; nothing else.
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: {{ include "virtualcluster.componentName" (list $root $component) }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "virtualcluster.componentLabels" (list $root $component) | nindent 4 }}
spec:
  podSelector:
    matchLabels:
      {{- include "virtualcluster.componentSelectorLabels" (list $root $component) | nindent 6 }}
  policyTypes: [Ingress]
  ingress:
    {{- include "virtualcluster.adminIngress" (list $root $port) | nindent 4 }}
{{- end }}

{{/* The username of a component's ServiceAccount, as admission sees it. Usage: include "virtualcluster.serviceAccountUser" (list . "syncer" .Values.syncer) */}}
{{- define "virtualcluster.serviceAccountUser" -}}
{{- printf "system:serviceaccount:%s:%s" (index . 0).Release.Namespace (include "virtualcluster.serviceAccountName" .) }}
{{- end }}

{{/* The snapshot scheduler's Lease (kubectl-vc's schedule::lease_name of its store pvc/<claim>). */}}
{{- define "virtualcluster.snapshotsLeaseName" -}}
{{- printf "vc-snapshots-pvc-%s" (include "virtualcluster.snapshotsClaimName" .) | lower | trunc 253 | trimSuffix "-" }}
{{- end }}

{{/* Seconds of a duration such as 90s, 4m or 1h30m (checked by the caller). */}}
{{- define "virtualcluster.durationSeconds" -}}
{{- $total := 0 }}
{{- range (regexFindAll "[0-9]+[smh]" (toString .) -1) }}
{{- $number := int (trimSuffix "s" (trimSuffix "m" (trimSuffix "h" .))) }}
{{- if hasSuffix "h" . }}{{ $total = add $total (mul $number 3600) }}
{{- else if hasSuffix "m" . }}{{ $total = add $total (mul $number 60) }}
{{- else }}{{ $total = add $total $number }}{{ end }}
{{- end }}
{{- $total }}
{{- end }}
