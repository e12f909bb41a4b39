{{/* The chart's names and labels, and the facts several templates share (kubelet paths, config). */}}

{{- define "devshim.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The objects' name: the release's, with the chart's name added unless it already holds it. */}}
{{- define "devshim.fullname" -}}
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

{{- define "devshim.configMapName" -}}
{{- printf "%s-config" (include "devshim.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels: they must never change for an installed release (a DaemonSet's selector
is immutable). */}}
{{- define "devshim.selectorLabels" -}}
app.kubernetes.io/name: {{ include "devshim.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Every object's labels, and the pods': the kustomize base's, with Helm's own. */}}
{{- define "devshim.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "devshim.selectorLabels" . }}
app.kubernetes.io/component: device-plugin
app.kubernetes.io/part-of: devshim
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{- define "devshim.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* kubeletRootDir without a trailing slash; an absolute path or the render fails. */}}
{{- define "devshim.kubeletRootDir" -}}
{{- $root := .Values.kubeletRootDir | trimSuffix "/" }}
{{- if not (hasPrefix "/" $root) }}
{{- fail (printf "kubeletRootDir must be an absolute directory, not %q" .Values.kubeletRootDir) }}
{{- end }}
{{- $root }}
{{- end }}

{{/* The kubelet directories: volume name and host (= container) path. The first three devshim
mounts always; plugins is dra.plugins_dir, of which it mounts only each DRA driver's folder. */}}
{{- define "devshim.kubeletDirs" -}}
{{- $root := include "devshim.kubeletRootDir" . }}
device-plugins: {{ printf "%s/device-plugins" $root | quote }}
plugins-registry: {{ printf "%s/plugins_registry" $root | quote }}
pod-resources: {{ printf "%s/pod-resources" $root | quote }}
plugins: {{ printf "%s/plugins" $root | quote }}
{{- end }}

{{/* "true" where devshim is a DRA driver's kubelet plugin (dra.enabled, or config.dra.drivers with
a kubeconfig of its own), so the pods mount the kubelet's plugins directory and the CDI directory;
"" otherwise. */}}
{{- define "devshim.dra" -}}
{{- if or .Values.dra.enabled (dig "dra" "drivers" list .Values.config) }}true{{ end }}
{{- end }}

{{/* config.dra.drivers' names as a JSON list, in order: the drivers whose folders the pods mount
(<plugins>/<name>) and whose ResourceSlices the admission policy lets them write. Each must be a
lowercase DNS subdomain (as devshim requires), or the render fails: it names a host path. */}}
{{- define "devshim.draDriverNames" -}}
{{- $names := list }}
{{- range $i, $driver := (dig "dra" "drivers" list .Values.config) }}
{{- $name := "" }}
{{- if kindIs "map" $driver }}{{ $name = get $driver "name" | toString }}{{ end }}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$" $name) }}
{{- fail (printf "config.dra.drivers[%d].name: %q is not a DRA driver name (a lowercase DNS subdomain)" $i $name) }}
{{- end }}
{{- $names = append $names $name }}
{{- end }}
{{- toJson $names }}
{{- end }}

{{/* The DRA drivers whose config sets binding_conditions: devshim watches claims and writes their
status.devices for them (docs/dra.md, "Binding conditions"), a JSON list. */}}
{{- define "devshim.draBindingDriverNames" -}}
{{- $names := list }}
{{- range $driver := (dig "dra" "drivers" list .Values.config) }}
{{- if and (kindIs "map" $driver) (get $driver "binding_conditions") }}
{{- $names = append $names (get $driver "name" | toString) }}
{{- end }}
{{- end }}
{{- toJson $names }}
{{- end }}

{{/* Where devshim writes the prepared claims' CDI specs, mounted from the same host path. */}}
{{- define "devshim.cdiDir" -}}
{{- dig "dra" "cdi_dir" "/var/run/cdi" .Values.config | default "/var/run/cdi" }}
{{- end }}

{{/* The legacy sidecar's shared directory, as devshim's container sees it. */}}
{{- define "devshim.legacyDir" -}}/legacy{{- end }}

{{- define "devshim.opsPort" -}}
{{- dig "http" "port" 9477 .Values.config | int }}
{{- end }}

{{- define "devshim.stateDir" -}}
{{- .Values.config.state_dir | default "/var/lib/devshim" }}
{{- end }}

{{/* config.yaml: the config value with its kubelet paths set from kubeletRootDir (dra.plugins_dir
too, where "devshim.dra") and its drivers followed by `drivers` and, in the sidecar form, the legacy
adapter. DRA drivers need the API server's credentials: dra.enabled's (the pods' token) or a
kubeconfig of config.dra's own. With nodeConfigs.configs, node_configs says which node label
chooses among them and where the pods find them. */}}
{{- define "devshim.config" -}}
{{- if hasKey .Values.config "node_configs" }}
{{- fail "config.node_configs is set from nodeConfigs: remove it from config" }}
{{- end }}
{{- $config := include "devshim.configFrom" (list . .Values.config) | fromYaml }}
{{- with .Values.nodeConfigs }}
{{- if .configs }}
{{- $chooser := dict "label" .label "folder" (include "devshim.nodeConfigsDir" $) "wait_s" .waitSeconds }}
{{- $_ := set $config "node_configs" $chooser }}
{{- end }}
{{- end }}
{{- toYaml $config }}
{{- end }}

{{/* nodeConfigs.configs' NAME as the pods read it, (list $ NAME): config with NAME's keys in
their place (the drivers, resources and log settings a label's switch applies), made as
config.yaml is. */}}
{{- define "devshim.nodeConfig" -}}
{{- $root := index . 0 }}
{{- $config := deepCopy $root.Values.config }}
{{- range $key, $value := index $root.Values.nodeConfigs.configs (index . 1) }}
{{- $_ := set $config $key $value }}
{{- end }}
{{- include "devshim.configFrom" (list $root $config) }}
{{- end }}

{{/* Where the pods find the named configs, NAME.yaml each (the config volume's nodes/ folder). */}}
{{- define "devshim.nodeConfigsDir" -}}/etc/devshim/nodes{{- end }}

{{/* config.yaml's making (above), of the config given: (list $ CONFIG). */}}
{{- define "devshim.configFrom" -}}
{{- $root := index . 0 }}
{{- $dirs := include "devshim.kubeletDirs" $root | fromYaml }}
{{- $config := deepCopy (index . 1) }}
{{- $deallocation := deepCopy ($config.deallocation | default dict) }}
{{- range $key := list "device_plugins_dir" "plugins_registry_dir" }}
{{- if hasKey $config $key }}
{{- fail (printf "config.%s is set from kubeletRootDir: remove it from config" $key) }}
{{- end }}
{{- end }}
{{- $dra := $config.dra | default dict }}
{{- if and $dra.drivers (not $root.Values.dra.enabled) (not $dra.kubeconfig) }}
{{- fail "config.dra.drivers publishes ResourceSlices through the API server: set dra.enabled (the pods' service account, token and RBAC), or config.dra.kubeconfig" }}
{{- end }}
{{- if hasKey $dra "plugins_dir" }}
{{- fail "config.dra.plugins_dir is set from kubeletRootDir: remove it from config" }}
{{- end }}
{{- if hasKey $deallocation "pod_resources_socket" }}
{{- fail "config.deallocation.pod_resources_socket is set from kubeletRootDir: remove it from config" }}
{{- end }}
{{- $_ := set $config "device_plugins_dir" (get $dirs "device-plugins") }}
{{- $_ = set $config "plugins_registry_dir" (get $dirs "plugins-registry") }}
{{- $_ = set $deallocation "pod_resources_socket" (printf "%s/kubelet.sock" (get $dirs "pod-resources")) }}
{{- $_ = set $config "deallocation" $deallocation }}
{{- if include "devshim.dra" $root }}
{{- $_ = set $config "dra" (set (deepCopy $dra) "plugins_dir" (get $dirs "plugins")) }}
{{- end }}
{{- $drivers := concat ($config.drivers | default list) $root.Values.drivers }}
{{- with $root.Values.legacySidecar }}
{{- if .enabled }}
{{- if not .deviceResources }}
{{- fail "legacySidecar.deviceResources: name the resources the vendor plugin registers (devshim serves no others)" }}
{{- end }}
{{- $command := concat (list "/opt/devshim/bin/devshim-legacy" "--kubelet-dir" (include "devshim.legacyDir" $root)) .adapterArgs }}
{{- range .deviceResources }}
{{- $command = concat $command (list "--resource" .) }}
{{- end }}
{{- $legacy := dict "name" "legacy" "command" $command "resources" .deviceResources }}
{{- with .user }}
{{- $_ = set $legacy "user" . }}
{{- end }}
{{- with .policy }}
{{- $_ = set $legacy "policy" . }}
{{- end }}
{{- $drivers = append $drivers $legacy }}
{{- end }}
{{- end }}
{{- $_ = set $config "drivers" ($drivers | default list) }}{{/* concat of nothing is nil, not [] */}}
{{- toYaml $config }}
{{- end }}

{{/* The service account devshim's pods run as with DRA: serviceAccount.name, else the release's
fullname. */}}
{{- define "devshim.serviceAccount" -}}
{{- .Values.serviceAccount.name | default (include "devshim.fullname" .) }}
{{- end }}

{{/* The namespace of the namespaced objects: namespaceOverride, else the release's. */}}
{{- define "devshim.namespace" -}}
{{- .Values.namespaceOverride | default .Release.Namespace }}
{{- end }}

{{/* "true" where devshim's pods talk to the API server as the chart's service account, with
their own token: DRA's publishing (dra.enabled), a node label choosing the config (nodeConfigs). */}}
{{- define "devshim.apiAccess" -}}
{{- if or .Values.dra.enabled .Values.nodeConfigs.configs }}true{{ end }}
{{- end }}
