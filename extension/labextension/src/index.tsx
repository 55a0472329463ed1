/**
 * jupyterlab-clustersdk: the "GPU clusters" sidebar, a panel per job, a status-bar
 * item, command-palette commands and a setting for the refresh interval, all on the
 * clustersdk server extension's REST API.
 */

import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette, MainAreaWidget, Notification, WidgetTracker } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookActions } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon, ReactWidget } from '@jupyterlab/ui-components';
import * as React from 'react';

import { JobPanel } from './jobpanel';
import { Action, ACTIONS, attachCode, IJobJSON, statusText } from './models';
import { ClustersSidebar } from './sidebar';
import { DEFAULT_INTERVAL, PanelState } from './state';

const PLUGIN_ID = 'jupyterlab-clustersdk:plugin';
const CATEGORY = 'GPU clusters';

const clustersIcon = new LabIcon({
  name: 'clustersdk:gpu',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" width="16">' +
    '<g class="jp-icon3" fill="#616161">' +
    '<path d="M7 7h10v10H7zM9 9v6h6V9z"/>' +
    '<path d="M9 3h2v3H9zM13 3h2v3h-2zM9 18h2v3H9zM13 18h2v3h-2zM3 9h3v2H3zM3 13h3v2H3z' +
    'M18 9h3v2h-3zM18 13h3v2h-3z"/></g></svg>'
});

export const CommandIDs = {
  open: 'clustersdk:open',
  refresh: 'clustersdk:refresh',
  openJob: 'clustersdk:open-job',
  insert: 'clustersdk:insert-attach-code',
  action: (a: Action) => `clustersdk:${a}`
};

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'GPU clusters and distributed jobs run by clustersdk',
  autoStart: true,
  optional: [ICommandPalette, IStatusBar, ISettingRegistry, INotebookTracker, ILayoutRestorer],
  activate: (
    app: JupyterFrontEnd,
    palette: ICommandPalette | null,
    statusBar: IStatusBar | null,
    settings: ISettingRegistry | null,
    notebooks: INotebookTracker | null,
    restorer: ILayoutRestorer | null
  ) => {
    const state = new PanelState();
    const panels = new WidgetTracker<MainAreaWidget<JobPanel>>({ namespace: 'clustersdk-job' });
    let interval = DEFAULT_INTERVAL;

    const openJob = (job: IJobJSON | string) => {
      const id = typeof job === 'string' ? state.job(job)?.id ?? job : job.id;
      const open = panels.find(w => w.content.jobId === id);
      if (open) {
        app.shell.activateById(open.id);
        return;
      }
      const content = new JobPanel(id, state, insertCode, interval);
      const widget = new MainAreaWidget({ content });
      widget.id = `clustersdk-job-${id}`;
      widget.title.icon = clustersIcon;
      widget.title.closable = true;
      content.title.changed.connect(() => (widget.title.label = content.title.label));
      widget.title.label = content.title.label;
      void panels.add(widget);
      app.shell.add(widget, 'main');
      app.shell.activateById(widget.id);
    };

    const insertCode = (job: IJobJSON) => {
      const notebook = notebooks?.currentWidget;
      const address = state.cluster(job.cluster)?.address;
      if (!notebook || !address) {
        Notification.warning(
          `Open a notebook first: the attach code for job ${job.name} goes into the active one`,
          { autoClose: 5000 }
        );
        return;
      }
      NotebookActions.insertBelow(notebook.content);
      const cell = notebook.content.activeCell;
      cell?.model.sharedModel.setSource(attachCode(address, job.name));
      app.shell.activateById(notebook.id);
      notebook.content.activate();
    };

    const sidebar = new ClustersSidebar(state, { openJob, insertCode });
    sidebar.title.icon = clustersIcon;
    app.shell.add(sidebar, 'left', { rank: 600 });
    restorer?.add(sidebar, sidebar.id);

    // commands ------------------------------------------------------------------------------
    const target = (args: any): string | null => (args?.job as string) ?? state.selected;
    app.commands.addCommand(CommandIDs.open, {
      label: 'Show GPU clusters',
      icon: clustersIcon,
      execute: () => app.shell.activateById(sidebar.id)
    });
    app.commands.addCommand(CommandIDs.refresh, {
      label: 'Refresh GPU clusters',
      execute: () => state.refresh()
    });
    app.commands.addCommand(CommandIDs.openJob, {
      label: args => (args?.job ? `Open job ${args.job}` : 'Open the selected job'),
      isEnabled: args => target(args) !== null,
      execute: args => {
        const job = target(args);
        if (job) {
          openJob(job);
        }
      }
    });
    app.commands.addCommand(CommandIDs.insert, {
      label: 'Insert attach code for the selected job',
      isEnabled: args => target(args) !== null,
      execute: args => {
        const job = state.job(target(args));
        if (job) {
          insertCode(job);
        }
      }
    });
    for (const action of ACTIONS) {
      app.commands.addCommand(CommandIDs.action(action), {
        label: args =>
          args?.job ? `${capital(action)} job ${args.job}` : `${capital(action)} the selected job`,
        isEnabled: args => target(args) !== null,
        // the server decides: a refusal (409) or a vanished job (404) becomes a notification
        execute: args => {
          const job = target(args);
          const body = action === 'resume' && args?.world_size ? { world_size: args.world_size } : undefined;
          return job ? state.act(job, action, body) : null;
        }
      });
    }
    const commands = [
      CommandIDs.open, CommandIDs.refresh, CommandIDs.openJob, CommandIDs.insert,
      ...ACTIONS.map(CommandIDs.action)
    ];
    for (const command of commands) {
      palette?.addItem({ command, category: CATEGORY });
    }

    // status bar ----------------------------------------------------------------------------
    if (statusBar) {
      const item = new StatusItem(state, () => app.shell.activateById(sidebar.id));
      statusBar.registerStatusItem('clustersdk:status', { item, align: 'left', rank: 50 });
    }

    // settings ------------------------------------------------------------------------------
    const apply = (loaded: ISettingRegistry.ISettings) => {
      interval = Number(loaded.composite['refreshInterval']) || DEFAULT_INTERVAL;
      state.interval = interval;
      panels.forEach(w => (w.content.interval = interval));
    };
    if (settings) {
      settings
        .load(PLUGIN_ID)
        .then(loaded => {
          apply(loaded);
          loaded.changed.connect(apply);
        })
        .catch(reason => console.warn('clustersdk: settings not loaded', reason));
    }
    state.start();
  }
};

/** "clustersdk: 2 running · 6/8 GPUs busy"; a click shows the sidebar. */
class StatusItem extends ReactWidget {
  constructor(
    private readonly state: PanelState,
    private readonly onClick: () => void
  ) {
    super();
    this.addClass('jp-clustersdk-status');
    state.changed.connect(() => this.update(), this);
  }

  protected render(): JSX.Element {
    return (
      <span className="jp-clustersdk-status-text" title="Show GPU clusters" onClick={this.onClick}>
        {statusText(this.state.clusters)}
      </span>
    );
  }
}

function capital(word: string): string {
  return word[0].toUpperCase() + word.slice(1);
}

export default plugin;
